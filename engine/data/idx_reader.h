// A reader for IDX files (the MNIST container format), raw or gzip-compressed, unsigned bytes only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/idx_header.h"

namespace kiln {

// An IDX array of unsigned bytes: dims outermost first, data row-major.
struct IdxArray {
  std::vector<int64_t> dims;  // rank 1..4, each > 0
  std::vector<uint8_t> data;  // exactly the product of dims bytes
};

// Reads an IDX file of element type 0x08 (unsigned byte). gzip compression is detected by the
// magic bytes 1f 8b, not by the file name. The data must fill the dimensions exactly: a short
// file and trailing bytes are both errors. Errors (NotFound, PermissionDenied, InvalidArgument
// for a malformed header, DataLoss for truncated, overlong or corrupt contents) name the path
// and the problem. Thread-safe; never throws.
absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path);

// Reads only the header of such a file (raw or gzip) and returns its dimensions, with
// ReadIdxFile's checks and errors for everything up to the data.
absl::StatusOr<std::vector<int64_t>> ReadIdxFileDims(const std::string& path);

// Parses IDX bytes already in memory (uncompressed), with the same checks as ReadIdxFile;
// `name` is used in error messages in place of a path.
absl::StatusOr<IdxArray> ParseIdx(std::string_view bytes, const std::string& name);

}  // namespace kiln
