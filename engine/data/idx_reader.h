// A reader for IDX files (the MNIST container format), raw or gzip-compressed, unsigned bytes only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln {

// An IDX array of unsigned bytes: dims outermost first, data row-major.
struct IdxArray {
  std::vector<int64_t> dims;  // rank 1..4, each > 0
  std::vector<uint8_t> data;  // exactly the product of dims bytes
};

// The largest element count ReadIdxFile accepts (2^31), bounding memory for a hostile header.
inline constexpr int64_t kMaxIdxElements = int64_t{1} << 31;

// Reads an IDX file of element type 0x08 (unsigned byte). gzip compression is detected by the
// magic bytes 1f 8b, not by the file name. The data must fill the dimensions exactly: a short
// file and trailing bytes are both errors. Errors (NotFound, PermissionDenied, InvalidArgument
// for a malformed header, DataLoss for truncated, overlong or corrupt contents) name the path
// and the problem. Thread-safe; never throws.
absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path);

// Parses IDX bytes already in memory (uncompressed), with the same checks as ReadIdxFile;
// `name` is used in error messages in place of a path.
absl::StatusOr<IdxArray> ParseIdx(std::string_view bytes, const std::string& name);

}  // namespace kiln
