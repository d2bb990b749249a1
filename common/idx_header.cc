#include "common/idx_header.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace kiln {
namespace {

constexpr size_t kMagicBytes = 4;

const char* IdxTypeName(uint8_t type) {
  switch (type) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "int16";
    case 0x0C:
      return "int32";
    case 0x0D:
      return "float32";
    case 0x0E:
      return "float64";
  }
  return nullptr;
}

uint8_t Byte(absl::string_view bytes, size_t at) { return static_cast<uint8_t>(bytes[at]); }

}  // namespace

size_t IdxHeaderBytes(absl::string_view first4) {
  if (first4.size() < kMagicBytes || Byte(first4, 0) != 0 || Byte(first4, 1) != 0 ||
      Byte(first4, 2) != kIdxUnsignedByte || Byte(first4, 3) < 1 || Byte(first4, 3) > kMaxIdxRank) {
    return 0;
  }
  return kMagicBytes + 4 * size_t{Byte(first4, 3)};
}

absl::StatusOr<IdxHeader> ParseIdxHeader(absl::string_view bytes, absl::string_view name,
                                         absl::string_view content) {
  if (bytes.empty()) {
    return absl::DataLossError(
        absl::StrCat(name, ": truncated header: ", content, " is empty, expected an IDX header"));
  }
  if (bytes.size() < kMagicBytes) {
    return absl::DataLossError(
        absl::StrFormat("%s: truncated header: %s has only %d bytes, an IDX header is at least 8",
                        name, content, bytes.size()));
  }
  if (Byte(bytes, 0) != 0 || Byte(bytes, 1) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: bad magic: starts with 0x%02x 0x%02x, an IDX file starts with 0x00 0x00", name,
        Byte(bytes, 0), Byte(bytes, 1)));
  }
  const uint8_t type = Byte(bytes, 2);
  if (type != kIdxUnsignedByte) {
    const char* type_name = IdxTypeName(type);
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: unsupported element type 0x%02x (%s); only 0x08 (unsigned byte) is supported", name,
        type, type_name ? type_name : "not an IDX type"));
  }
  const int rank = Byte(bytes, 3);
  if (rank < 1 || rank > kMaxIdxRank) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: unsupported rank %d: only rank 1 to %d is supported", name, rank, kMaxIdxRank));
  }
  IdxHeader header;
  header.size_bytes = kMagicBytes + 4 * static_cast<size_t>(rank);
  if (bytes.size() < header.size_bytes) {
    return absl::DataLossError(absl::StrFormat(
        "%s: truncated header: rank %d needs a %d-byte header but %s has only %d bytes", name, rank,
        header.size_bytes, content, bytes.size()));
  }
  header.dims.resize(rank);
  for (int i = 0; i < rank; ++i) {
    const size_t at = kMagicBytes + 4 * static_cast<size_t>(i);  // big-endian uint32
    header.dims[i] = (int64_t{Byte(bytes, at)} << 24) | (int64_t{Byte(bytes, at + 1)} << 16) |
                     (int64_t{Byte(bytes, at + 2)} << 8) | Byte(bytes, at + 3);
  }
  const std::string dims_str = absl::StrJoin(header.dims, "x");
  int64_t elements = 1;
  for (int i = 0; i < rank; ++i) {
    if (header.dims[i] == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: zero dimension: dimension %d of %s is 0; every dimension must be > 0", name, i,
          dims_str));
    }
    // Dividing first keeps the check itself from overflowing.
    if (elements > kMaxIdxElements / header.dims[i]) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: too large: header dims %s exceed the limit of %d elements", name,
                          dims_str, kMaxIdxElements));
    }
    elements *= header.dims[i];
  }
  header.elements = elements;
  return header;
}

}  // namespace kiln
