// One kilnd per state dir: two would both resume the same jobs and write the same checkpoints.
// An exclusive flock on <state_dir>/kilnd.lock, held for the daemon's life (the kernel drops it
// when the process dies, however it dies, so a crash never leaves the dir locked).
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace kiln::server {

class StateDirLock {
 public:
  // FailedPrecondition naming the holder's pid when another live process holds it.
  static absl::StatusOr<StateDirLock> Acquire(const std::string& state_dir);
  StateDirLock(StateDirLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  StateDirLock& operator=(StateDirLock&& other) noexcept;
  StateDirLock(const StateDirLock&) = delete;
  StateDirLock& operator=(const StateDirLock&) = delete;
  ~StateDirLock();

 private:
  explicit StateDirLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace kiln::server
