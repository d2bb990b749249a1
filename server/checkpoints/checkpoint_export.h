// Reads a checkpoint file for export in chunks, hashing as it goes: the first chunk carries the
// checkpoint's record, the last the file's sha256. The gRPC edge only writes the chunks.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/sha256.h"
#include "kiln/v1/training.pb.h"

namespace kiln::server {

class CheckpointExport {
 public:
  // Opens the checkpoint's file once, so a checkpoint pruned during the export still streams
  // whole. NotFound when the file is gone.
  static absl::StatusOr<std::unique_ptr<CheckpointExport>> Open(v1::Checkpoint checkpoint,
                                                                int chunk_bytes);
  ~CheckpointExport();
  CheckpointExport(const CheckpointExport&) = delete;
  CheckpointExport& operator=(const CheckpointExport&) = delete;

  // Fills `chunk` with the next piece (DataLoss when the read fails); call until done().
  absl::Status Next(v1::CheckpointChunk* chunk);
  bool done() const { return done_; }

 private:
  CheckpointExport(v1::Checkpoint checkpoint, int fd, int64_t size, int chunk_bytes);

  v1::Checkpoint checkpoint_;
  int fd_;
  int64_t size_;
  int64_t offset_ = 0;
  std::vector<char> buffer_;
  Sha256 sha_;
  bool done_ = false;
};

}  // namespace kiln::server
