// A checkpoint file against the SHA-256 recorded when it was written: what resume, deploy and
// export check before they trust the file.
#pragma once

#include "absl/status/status.h"
#include "kiln/v1/training.pb.h"

namespace kiln::server {

// OK when the file's digest is the recorded one (or none was recorded: checkpoints written before
// kilnd recorded digests); DATA_LOSS naming the checkpoint and the file when it differs, NOT_FOUND
// when the file is gone.
absl::Status VerifyCheckpointFile(const v1::Checkpoint& checkpoint);

// The DATA_LOSS for a checkpoint whose bytes hash to `actual` instead of the recorded digest.
absl::Status CheckpointDigestMismatch(const v1::Checkpoint& checkpoint, const std::string& actual);

}  // namespace kiln::server
