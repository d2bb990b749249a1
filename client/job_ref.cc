#include "client/job_ref.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/cli_status.h"

namespace kiln::client {

std::string CheckpointRef::ToString() const {
  switch (which) {
    case Which::kBest:
      return absl::StrCat(job_id, "@best");
    case Which::kId:
      return absl::StrCat(job_id, "@", checkpoint_id);
    case Which::kLatest:
      break;
  }
  return absl::StrCat(job_id, "@latest");
}

absl::StatusOr<CheckpointRef> ParseCheckpointRef(const std::string& text) {
  CheckpointRef ref;
  const size_t at = text.find('@');
  ref.job_id = text.substr(0, at);
  if (ref.job_id.empty()) {
    return UsageError(absl::StrCat("\"", text, "\": expected JOB, JOB@ID, JOB@best or JOB@latest"));
  }
  if (at == std::string::npos) return ref;
  const std::string which = text.substr(at + 1);
  if (which == "latest") return ref;
  if (which == "best") {
    ref.which = CheckpointRef::Which::kBest;
    return ref;
  }
  if (!absl::SimpleAtoi(which, &ref.checkpoint_id) || ref.checkpoint_id <= 0) {
    return UsageError(absl::StrCat("\"", text,
                                   "\": the part after @ must be a checkpoint id (see kiln "
                                   "checkpoints JOB), best or latest"));
  }
  ref.which = CheckpointRef::Which::kId;
  return ref;
}

}  // namespace kiln::client
