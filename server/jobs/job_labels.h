// The checks on a job's display name and labels (JobSpec.name, JobSpec.labels): short, printable,
// safe in a table, a log line and a shell, and few, since every job listing carries them.
#pragma once

#include "absl/status/status.h"
#include "kiln/v1/model_spec.pb.h"

namespace kiln::server {

inline constexpr int kMaxJobNameLength = 64;
inline constexpr int kMaxLabels = 32;
inline constexpr int kMaxLabelKeyLength = 63;
inline constexpr int kMaxLabelValueLength = 128;

// OK, or INVALID_ARGUMENT naming the field ("spec.name", "spec.labels[\"team\"]") and the rule
// it breaks. The rules are model_spec.proto's.
absl::Status ValidateNameAndLabels(const v1::JobSpec& spec);

}  // namespace kiln::server
