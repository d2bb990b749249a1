// Checkpoint files between rank 0 and kilnd, which stores them: the one a resumed attempt starts
// from (Workers.ReadCheckpoint) and the ones rank 0 writes (Workers.WriteCheckpoint), both
// checked against their sha256.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/worker/coordinator_connection.h"

namespace kiln::worker {

// Reads checkpoint `checkpoint` of job `job_id` into `path` (written atomically). DataLoss when
// the bytes do not match the digest kilnd sends (or the one `checkpoint` records).
absl::Status DownloadCheckpoint(CoordinatorConnection& connection, const std::string& job_id,
                                const v1::Checkpoint& checkpoint, const std::string& path);

// Sends the file at `path` with `header` (job, kind, position, write_seconds; its sha256 and
// size are filled in here) in 1 MiB messages; returns kilnd's record of it.
absl::StatusOr<v1::Checkpoint> UploadCheckpoint(CoordinatorConnection& connection,
                                                v1::WriteCheckpointHeader header,
                                                const std::string& path);

}  // namespace kiln::worker
