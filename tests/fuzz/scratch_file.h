// A file that a fuzz target rewrites with each input, for code that reads only from a path.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"

namespace kiln::fuzz {

// A file in a private directory under $TMPDIR (or /tmp), made on first use and removed with the
// directory when the process exits. Not thread-safe: fuzz targets run one input at a time.
class ScratchFile {
 public:
  // The process's scratch file called `name` (one directory per process).
  static ScratchFile& Get(const std::string& name);

  const std::string& path() const { return path_; }
  // Replaces the file's contents with `bytes`; an error names the path.
  absl::Status Write(std::string_view bytes) const;

 private:
  explicit ScratchFile(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace kiln::fuzz
