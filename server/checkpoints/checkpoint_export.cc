#include "server/checkpoints/checkpoint_export.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/checkpoints/checkpoint_integrity.h"

namespace kiln::server {

absl::StatusOr<std::unique_ptr<CheckpointExport>> CheckpointExport::Open(v1::Checkpoint checkpoint,
                                                                         int chunk_bytes) {
  const int fd = ::open(checkpoint.path().c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0) {
    if (fd >= 0) ::close(fd);
    return absl::NotFoundError(absl::StrCat("checkpoint file ", checkpoint.path(), " is missing"));
  }
  return std::unique_ptr<CheckpointExport>(
      new CheckpointExport(std::move(checkpoint), fd, st.st_size, chunk_bytes));
}

CheckpointExport::CheckpointExport(v1::Checkpoint checkpoint, int fd, int64_t size, int chunk_bytes)
    : checkpoint_(std::move(checkpoint)), fd_(fd), size_(size), buffer_(chunk_bytes) {}

CheckpointExport::~CheckpointExport() { ::close(fd_); }

absl::Status CheckpointExport::Next(v1::CheckpointChunk* chunk) {
  chunk->Clear();
  if (offset_ == 0) *chunk->mutable_checkpoint() = checkpoint_;
  ssize_t n;
  do {
    n = ::pread(fd_, buffer_.data(), buffer_.size(), offset_);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    return absl::DataLossError(absl::StrCat("reading the checkpoint failed: ", checkpoint_.path(),
                                            ": ", std::strerror(errno)));
  }
  const absl::string_view data(buffer_.data(), static_cast<size_t>(n));
  chunk->set_offset(offset_);
  chunk->set_data(data.data(), data.size());
  sha_.Update(data);
  offset_ += n;
  if (offset_ >= size_ || n == 0) {
    const std::string digest = sha_.HexDigest();
    // The client checks what it got against this digest; it must be the checkpoint's as written,
    // not that of whatever the file holds now.
    if (!checkpoint_.sha256().empty() && digest != checkpoint_.sha256()) {
      return CheckpointDigestMismatch(checkpoint_, digest);
    }
    chunk->set_sha256(digest);
    done_ = true;
  }
  return absl::OkStatus();
}

}  // namespace kiln::server
