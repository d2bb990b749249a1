#include "server/checkpoints/checkpoint_integrity.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"

namespace kiln::server {

absl::Status CheckpointDigestMismatch(const v1::Checkpoint& checkpoint, const std::string& actual) {
  return absl::DataLossError(absl::StrCat("checkpoint ", checkpoint.id(), " of job ",
                                          checkpoint.job_id(), " (", checkpoint.path(),
                                          ") has sha256 ", actual, " but ", checkpoint.sha256(),
                                          " when it was written: the file was damaged on disk"));
}

absl::Status VerifyCheckpointFile(const v1::Checkpoint& checkpoint) {
  if (checkpoint.sha256().empty()) return absl::OkStatus();
  absl::StatusOr<std::string> actual = Sha256OfFile(checkpoint.path());
  if (!actual.ok()) {
    return absl::Status(actual.status().code(),
                        absl::StrCat("checkpoint ", checkpoint.id(), " of job ",
                                     checkpoint.job_id(), ": ", actual.status().message()));
  }
  if (*actual == checkpoint.sha256()) return absl::OkStatus();
  return CheckpointDigestMismatch(checkpoint, *actual);
}

}  // namespace kiln::server
