#include "server/jobs/state_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace kiln::server {

absl::StatusOr<StateDirLock> StateDirLock::Acquire(const std::string& state_dir) {
  const std::string path = state_dir + "/kilnd.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat("--state_dir=", state_dir, ": cannot open ",
                                                      path, ": ", std::strerror(errno)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[32] = {};
    const ssize_t n = ::pread(fd, holder, sizeof(holder) - 1, 0);
    ::close(fd);
    if (err == EWOULDBLOCK) {
      const std::string pid(absl::StripAsciiWhitespace(std::string(holder, n > 0 ? n : 0)));
      return absl::FailedPreconditionError(
          absl::StrCat("--state_dir=", state_dir, " is in use by another kilnd",
                       pid.empty() ? "" : absl::StrCat(" (pid ", pid, ")"),
                       "; give each daemon its own state dir"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("--state_dir=", state_dir, ": cannot lock ", path, ": ", std::strerror(err)));
  }
  // Our pid, for the message another start would print; the lock itself is what counts.
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    // Only the message suffers; the lock is held.
  }
  return StateDirLock(fd);
}

StateDirLock& StateDirLock::operator=(StateDirLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

StateDirLock::~StateDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

}  // namespace kiln::server
