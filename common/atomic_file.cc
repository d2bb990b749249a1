#include "common/atomic_file.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kiln {
namespace {

constexpr absl::string_view kTempMarker = ".tmp.";
constexpr size_t kTempHexDigits = 16;

// PATH.tmp.<pid>.<random>; AtomicFileTempWriterPid reads the pid back, the two change together.
std::string TempPathFor(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  uint64_t random = 0;
  if (getrandom(&random, sizeof(random), GRND_NONBLOCK) != sizeof(random)) {
    random = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }
  random ^= counter.fetch_add(1) * 0x9E3779B97F4A7C15ull;
  return absl::StrFormat("%s%s%d.%016x", path, kTempMarker, static_cast<int>(::getpid()), random);
}

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::Status WriteError(int err, const std::string& path, absl::string_view step,
                        absl::string_view target) {
  return absl::ErrnoToStatus(err, absl::StrCat("writing ", path, ": ", step, " ", target));
}

}  // namespace

absl::StatusOr<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::Open(const std::string& path,
                                                                         mode_t mode) {
  std::string temp = TempPathFor(path);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return WriteError(errno, path, "open", temp);
  return std::unique_ptr<AtomicFileWriter>(new AtomicFileWriter(path, std::move(temp), fd));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!renamed_) ::unlink(temp_.c_str());
}

absl::Status AtomicFileWriter::Fail(int err, absl::string_view step, absl::string_view target) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  return WriteError(err, path_, step, target);
}

absl::Status AtomicFileWriter::Append(absl::string_view data) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("writing ", path_, ": closed"));
  while (!data.empty()) {
    const ssize_t n = ::write(fd_, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Fail(errno, "write", temp_);
    }
    if (n == 0) return Fail(EIO, "write", temp_);
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("writing ", path_, ": closed"));
  if (::fsync(fd_) != 0) return Fail(errno, "fsync", temp_);
  const int fd = fd_;
  fd_ = -1;
  // close() can report deferred write errors (NFS), so its result counts.
  if (::close(fd) != 0) return WriteError(errno, path_, "close", temp_);
  if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    return WriteError(errno, path_, "rename", absl::StrCat(temp_, " -> ", path_));
  }
  renamed_ = true;
  // Makes the rename itself durable.
  absl::Status synced = SyncDirectory(DirectoryOf(path_));
  if (!synced.ok()) {
    return absl::Status(synced.code(), absl::StrCat("writing ", path_, ": ", synced.message()));
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view content, mode_t mode) {
  absl::StatusOr<std::unique_ptr<AtomicFileWriter>> writer = AtomicFileWriter::Open(path, mode);
  if (!writer.ok()) return writer.status();
  absl::Status status = (*writer)->Append(content);
  if (!status.ok()) return status;
  return (*writer)->Commit();
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("open directory ", dir));
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::ErrnoToStatus(err, absl::StrCat("fsync directory ", dir));
  }
  ::close(fd);
  return absl::OkStatus();
}

int AtomicFileTempWriterPid(absl::string_view file_name) {
  const size_t at = file_name.rfind(kTempMarker);
  if (at == absl::string_view::npos) return -1;
  const absl::string_view rest = file_name.substr(at + kTempMarker.size());  // "<pid>.<hex>"
  const size_t dot = rest.find('.');
  if (dot == absl::string_view::npos || rest.size() - dot - 1 != kTempHexDigits) return -1;
  int pid = 0;
  if (!absl::SimpleAtoi(absl::string_view(rest.data(), dot), &pid) || pid <= 0) return -1;
  return pid;
}

}  // namespace kiln
