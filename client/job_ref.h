// "JOB[@CHECKPOINT]" references as export and deploy take them.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace kiln::client {

// A job and which of its checkpoints: a numeric id, the best, or the latest.
struct CheckpointRef {
  enum class Which { kLatest, kBest, kId };
  std::string job_id;
  Which which = Which::kLatest;
  int64_t checkpoint_id = 0;  // kId only

  // Back to text: "job-1@7", "job-1@best", "job-1@latest".
  std::string ToString() const;
};

// Parses "JOB", "JOB@latest", "JOB@best" or "JOB@ID"; a usage error otherwise.
absl::StatusOr<CheckpointRef> ParseCheckpointRef(const std::string& text);

}  // namespace kiln::client
