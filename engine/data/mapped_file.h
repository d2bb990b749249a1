// A whole file mapped read-only (MAP_SHARED, PROT_READ): token shards and uploaded text corpora
// are read through one, so nothing copies them into memory. Move-only; unmaps on destruction.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kiln {

class MappedFile {
 public:
  // How the pages will be read, for the kernel's read-ahead.
  enum class Access { kRandom, kSequential };

  // Maps `path`; an empty file gives an empty view. Errors name the path and `what` the file
  // should be ("a token shard"): NotFound, PermissionDenied, InvalidArgument for a directory,
  // Unavailable or ResourceExhausted otherwise.
  static absl::StatusOr<MappedFile> Open(const std::string& path, const char* what, Access access);

  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::string_view bytes() const { return {static_cast<const char*>(map_), size_}; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  void Advise(Access access) const;

 private:
  void Unmap();
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kiln
