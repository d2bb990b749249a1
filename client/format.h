// Human-readable renderings of the values kiln prints: states, durations, sizes, percentages,
// times and ages.
#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "google/protobuf/timestamp.pb.h"
#include "kiln/v1/training.pb.h"

namespace kiln::client {

// "RUNNING" for JOB_STATE_RUNNING.
std::string StateName(v1::JobState state);
// "on_demand" for CHECKPOINT_KIND_ON_DEMAND: the plain name, as kilnd spells kinds too.
std::string CheckpointKindName(v1::CheckpointKind kind);
// "1:05", "12:03:09" (hours only when needed); negative or infinite shows "--:--".
std::string FormatClock(absl::Duration d);
// "850ms", "12.3s", "4m05s", "2h10m".
std::string DurationText(absl::Duration d);
// "98.12%" for 0.9812.
std::string FormatPercent(double fraction);
// "2026-12-02 14:55:01" in UTC, or "-" when unset.
std::string FormatTime(const google::protobuf::Timestamp& t);
// How long ago: "45s", "3m", "2h", "5d"; "-" when unset.
std::string FormatAge(const google::protobuf::Timestamp& t, absl::Time now);
absl::Time ToAbslTime(const google::protobuf::Timestamp& t);
// What a job trains: its preset, or "custom (N layers)".
std::string ModelSummary(const v1::JobSpec& spec);
// Who made a job or dataset: "alice/vision" (user/team), "alice" for an admin of no team, "-"
// for one made before identities, while auth was off, or placed by hand.
std::string OwnerText(const v1::Owner& owner);

}  // namespace kiln::client
