// Opening and reading the files datasets load from, with one set of errors for every format:
// NotFound for a missing file, InvalidArgument for a directory, PermissionDenied, and
// Unavailable for any other failure to open; each names the path.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kiln {

struct FileCloser {
  void operator()(FILE* f) const {
    if (f != nullptr) std::fclose(f);
  }
};
using DataFile = std::unique_ptr<FILE, FileCloser>;

// Opens `path` for reading; `what` names the expected content in the directory error ("an IDX
// file": "PATH: is a directory, not an IDX file").
absl::StatusOr<DataFile> OpenDataFile(const std::string& path, const char* what);

// Reads at most max_bytes + 1 bytes of `path` (so a file over the limit is told without holding
// it all; the caller says what the limit means). DataLoss on a read error, ResourceExhausted when
// memory runs out.
absl::StatusOr<std::string> ReadDataFile(const std::string& path, const char* what,
                                         int64_t max_bytes);

}  // namespace kiln
