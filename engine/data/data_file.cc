#include "engine/data/data_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <new>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kiln {

absl::StatusOr<DataFile> OpenDataFile(const std::string& path, const char* what) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  // Other status errors (a parent we may not search, say) are left for fopen to report.
  if (st.type() == std::filesystem::file_type::not_found) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  }
  if (std::filesystem::is_directory(st)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, not ", what));
  }
  DataFile file(std::fopen(path.c_str(), "rb"));
  if (file == nullptr) {
    const int err = errno;
    const std::string msg = absl::StrCat(path, ": cannot open: ", std::strerror(err));
    if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
    if (err == ENOENT) return absl::NotFoundError(msg);
    return absl::UnavailableError(msg);
  }
  return file;
}

absl::StatusOr<std::string> ReadDataFile(const std::string& path, const char* what,
                                         int64_t max_bytes) {
  KILN_ASSIGN_OR_RETURN(DataFile file, OpenDataFile(path, what));
  std::string bytes;
  try {
    constexpr size_t kChunk = size_t{1} << 20;
    const size_t limit = static_cast<size_t>(max_bytes) + 1;
    while (true) {
      const size_t have = bytes.size();
      const size_t want = std::min(kChunk, limit - have);  // have <= limit throughout
      if (want == 0) break;
      bytes.resize(have + want);
      const size_t got = std::fread(bytes.data() + have, 1, want, file.get());
      bytes.resize(have + got);
      if (got < want) {
        if (std::ferror(file.get())) {
          return absl::DataLossError(absl::StrCat(path, ": read error: ", std::strerror(errno)));
        }
        break;
      }
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(path, ": out of memory reading the file"));
  }
  return bytes;
}

}  // namespace kiln
