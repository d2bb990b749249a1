#include "engine/data/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kiln {
namespace {

absl::Status OpenError(const std::string& path, const char* what, int err) {
  const std::string msg = absl::StrCat(path, ": cannot open ", what, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::UnavailableError(msg);
}

int AdviceOf(MappedFile::Access access) {
  return access == MappedFile::Access::kRandom ? MADV_RANDOM : MADV_SEQUENTIAL;
}

}  // namespace

absl::StatusOr<MappedFile> MappedFile::Open(const std::string& path, const char* what,
                                            Access access) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return OpenError(path, what, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return OpenError(path, what, err);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, not ", what));
  }
  MappedFile file;
  file.path_ = path;
  file.size_ = static_cast<size_t>(st.st_size);
  if (file.size_ > 0) {
    void* map = ::mmap(nullptr, file.size_, PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);  // the map keeps the file open
    if (map == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrCat(path, ": cannot map ", what, ": ", std::strerror(err)));
    }
    file.map_ = map;
    file.Advise(access);
  } else {
    ::close(fd);
  }
  return file;
}

void MappedFile::Advise(Access access) const {
  if (map_ != nullptr) ::madvise(map_, size_, AdviceOf(access));
}

MappedFile::~MappedFile() { Unmap(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::Unmap() {
  if (map_ != nullptr) ::munmap(map_, size_);
  map_ = nullptr;
  size_ = 0;
}

}  // namespace kiln
