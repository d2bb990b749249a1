// The header of an IDX file (the MNIST container): 00 00, an element type, a rank, then one
// big-endian uint32 per dimension. The one parser of it: the engine's reader, the dataset catalog
// and the client's image reader all go through ParseIdxHeader. Unsigned bytes (type 0x08) only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

inline constexpr uint8_t kIdxUnsignedByte = 0x08;
inline constexpr int kMaxIdxRank = 4;
// The largest element count accepted (2^31), bounding memory for a hostile header.
inline constexpr int64_t kMaxIdxElements = int64_t{1} << 31;

struct IdxHeader {
  std::vector<int64_t> dims;  // rank 1..4, each > 0, outermost first
  int64_t elements = 0;       // the product of dims, at most kMaxIdxElements
  size_t size_bytes = 0;      // 4 + 4 * rank: where the data starts
};

// The header's length when `first4` (a file's first four bytes) starts a header ParseIdxHeader
// can accept; 0 when it cannot, and ParseIdxHeader says why.
size_t IdxHeaderBytes(absl::string_view first4);

// Parses the header at the start of `bytes`, which may run on into the data. Errors start with
// `name` (a path); `content` says what `bytes` came from in truncation messages ("file",
// "decompressed file"): DataLoss for a truncated header, InvalidArgument for a bad magic, an
// unsupported type or rank, a zero dimension or too many elements.
absl::StatusOr<IdxHeader> ParseIdxHeader(absl::string_view bytes, absl::string_view name,
                                         absl::string_view content);

}  // namespace kiln
