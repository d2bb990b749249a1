// The jobs core's words, each defined once: how a job state and a checkpoint kind are spelled in
// messages, the event log, metric labels and file names, and which states are final. Header-only:
// the observers (metrics, log) use it without linking the jobs core.
#pragma once

#include <algorithm>
#include <cctype>
#include <string>

#include "absl/strings/match.h"
#include "kiln/v1/training.pb.h"

namespace kiln::server {

namespace vocabulary_internal {
// A proto enum value's name without the prefix every value of its enum carries.
inline std::string WithoutPrefix(std::string name, const char* prefix) {
  if (absl::StartsWith(name, prefix)) name.erase(0, std::char_traits<char>::length(prefix));
  return name;
}
}  // namespace vocabulary_internal

// SUCCEEDED, FAILED and CANCELLED: a job in one of them never changes again.
inline bool IsFinal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

// "RUNNING": the enum's name without its prefix, as error messages and the event log say it
// (and the CLI shows it).
inline std::string JobStateName(v1::JobState state) {
  return vocabulary_internal::WithoutPrefix(v1::JobState_Name(state), "JOB_STATE_");
}

// "running": the `state` label of the job metrics.
inline std::string JobStateLabel(v1::JobState state) {
  std::string name = JobStateName(state);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return name;
}

// "periodic", "best", "on_demand", "shutdown", "final", "cancel": a checkpoint kind as kiln spells
// it everywhere people see it (file names, the `kind` label of kiln_checkpoints_total, the event
// log, the CLI, the Python client): the enum's name without its prefix, lower-case, which is
// also what spec files and flags accept for any enum.
inline std::string CheckpointKindName(v1::CheckpointKind kind) {
  std::string name =
      vocabulary_internal::WithoutPrefix(v1::CheckpointKind_Name(kind), "CHECKPOINT_KIND_");
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return name.empty() ? "checkpoint" : name;
}

// "fp32", "tf32" or "bf16", as spec files and flags spell a job's precision; unset is fp32. On a
// CPU device (no TF32 units) a tf32 job computes in fp32, and this says so: "tf32 (on cpu: fp32,
// no TF32 units)". bf16 rounds the inputs of GEMMs and convolutions on every device: "bf16 (GEMMs
// and convolutions in bfloat16, the rest fp32)". For the event log to match what `kiln get` shows.
inline std::string JobPrecisionText(v1::Precision precision, const std::string& device) {
  const bool cpu = absl::StartsWith(device, "cpu");
  if (precision == v1::PRECISION_BF16) {
    return "bf16 (GEMMs and convolutions in bfloat16, the rest fp32)";
  }
  if (precision != v1::PRECISION_TF32) return "fp32";
  return cpu ? "tf32 (on cpu: fp32, no TF32 units)" : "tf32";
}

}  // namespace kiln::server
