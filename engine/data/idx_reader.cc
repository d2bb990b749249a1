#include "engine/data/idx_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/idx_header.h"
#include "common/status_macros.h"
#include "engine/data/data_file.h"

namespace kiln {
namespace {

// Reads go in pieces of this size; it also bounds the first allocation, so a header that lies
// about its size costs at most what the file really holds.
constexpr size_t kChunkBytes = size_t{1} << 20;
// Trailing bytes are counted up to this many, so a gzip bomb after the data cannot stall us.
constexpr size_t kMaxTrailingCount = size_t{64} << 20;

// A forward-only stream of bytes: a plain file, a gzip file, or memory.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads up to n bytes; 0 means end of input. Errors already name the source.
  virtual absl::StatusOr<size_t> Read(uint8_t* buf, size_t n) = 0;
};

class PlainFileSource : public ByteSource {
 public:
  PlainFileSource(FILE* file, std::string path) : file_(file), path_(std::move(path)) {}
  ~PlainFileSource() override { std::fclose(file_); }

  absl::StatusOr<size_t> Read(uint8_t* buf, size_t n) override {
    size_t got = std::fread(buf, 1, n, file_);
    if (got < n && std::ferror(file_)) {
      return absl::DataLossError(absl::StrCat(path_, ": read error: ", std::strerror(errno)));
    }
    return got;
  }

 private:
  FILE* file_;
  std::string path_;
};

class GzipFileSource : public ByteSource {
 public:
  GzipFileSource(gzFile file, std::string path) : file_(file), path_(std::move(path)) {}
  ~GzipFileSource() override { gzclose(file_); }

  absl::StatusOr<size_t> Read(uint8_t* buf, size_t n) override {
    // gzread takes an unsigned count and returns an int.
    auto want = static_cast<unsigned>(std::min<size_t>(n, INT_MAX));
    int got = gzread(file_, buf, want);
    int err = Z_OK;
    std::string msg = gzerror(file_, &err);
    // zlib prefixes its message with the path, which ours already carries.
    if (absl::StartsWith(msg, path_ + ": ")) msg.erase(0, path_.size() + 2);
    if (got < 0 || (err != Z_OK && err != Z_BUF_ERROR)) {
      if (err == Z_ERRNO) {
        return absl::DataLossError(absl::StrCat(path_, ": read error: ", std::strerror(errno)));
      }
      return absl::DataLossError(absl::StrCat(path_, ": corrupt gzip stream: ", msg));
    }
    // Z_BUF_ERROR is zlib's report of a compressed stream cut off before its end.
    if (err == Z_BUF_ERROR) {
      return absl::DataLossError(absl::StrCat(path_, ": truncated gzip stream: ", msg));
    }
    return static_cast<size_t>(got);
  }

 private:
  gzFile file_;
  std::string path_;
};

class MemorySource : public ByteSource {
 public:
  explicit MemorySource(std::string_view bytes) : bytes_(bytes) {}

  absl::StatusOr<size_t> Read(uint8_t* buf, size_t n) override {
    size_t got = std::min(n, bytes_.size());
    std::memcpy(buf, bytes_.data(), got);
    bytes_.remove_prefix(got);
    return got;
  }

 private:
  std::string_view bytes_;
};

// Reads until n bytes or the end of input; returns how many were read.
absl::StatusOr<size_t> ReadFull(ByteSource& src, uint8_t* buf, size_t n) {
  size_t have = 0;
  while (have < n) {
    KILN_ASSIGN_OR_RETURN(size_t got, src.Read(buf + have, n - have));
    if (got == 0) break;
    have += got;
  }
  return have;
}

// Reads and parses the header; leaves `src` at the first data byte.
absl::StatusOr<IdxHeader> ReadIdxHeader(ByteSource& src, const std::string& name,
                                        const std::string& content) {
  uint8_t bytes[4 + 4 * kMaxIdxRank];
  KILN_ASSIGN_OR_RETURN(size_t got, ReadFull(src, bytes, 4));
  absl::string_view head(reinterpret_cast<const char*>(bytes), got);
  // The dimensions are read only behind a header that can be accepted, so a bad magic, type or
  // rank is reported as such rather than as whatever reading on would hit.
  const size_t header_bytes = IdxHeaderBytes(head);
  if (header_bytes > got) {
    KILN_ASSIGN_OR_RETURN(size_t more, ReadFull(src, bytes + got, header_bytes - got));
    head = absl::string_view(reinterpret_cast<const char*>(bytes), got + more);
  }
  return ParseIdxHeader(head, name, content);
}

// Parses a whole IDX stream. `name` prefixes every message; `content` says what the byte counts
// refer to ("file" or "decompressed file").
absl::StatusOr<IdxArray> ParseIdxStream(ByteSource& src, const std::string& name,
                                        const std::string& content) {
  KILN_ASSIGN_OR_RETURN(IdxHeader header, ReadIdxHeader(src, name, content));
  IdxArray out;
  out.dims = std::move(header.dims);
  const size_t header_bytes = header.size_bytes;
  const auto expected = static_cast<size_t>(header.elements);
  const std::string dims_str = absl::StrJoin(out.dims, "x");
  // "60000x28x28 = 47040000 bytes", or just "10000 bytes" for rank 1.
  const std::string size_str = out.dims.size() == 1
                                   ? absl::StrCat(expected, " bytes")
                                   : absl::StrCat(dims_str, " = ", expected, " bytes");

  // Grows the buffer as data arrives rather than trusting the header's size up front.
  size_t have = 0;
  size_t got = 0;
  try {
    while (have < expected) {
      out.data.resize(std::min(expected, std::max(kChunkBytes, 2 * have)));
      KILN_ASSIGN_OR_RETURN(got, ReadFull(src, out.data.data() + have, out.data.size() - have));
      have += got;
      if (have < out.data.size()) break;  // end of input
    }
  } catch (const std::bad_alloc&) {
    // The one exception the standard library can raise here; a daemon must survive it.
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: out of memory reading %d bytes of IDX data (%s)", name, expected, dims_str));
  }
  if (have < expected) {
    return absl::DataLossError(absl::StrFormat(
        "%s: truncated: header says %s of data but %s has %d after the %d-byte header", name,
        size_str, content, have, header_bytes));
  }

  uint8_t extra[64 * 1024];
  size_t trailing = 0;
  while (trailing < kMaxTrailingCount) {
    KILN_ASSIGN_OR_RETURN(got, ReadFull(src, extra, sizeof(extra)));
    if (got == 0) break;
    trailing += got;
  }
  if (trailing > 0) {
    return absl::DataLossError(absl::StrFormat(
        "%s: trailing bytes: header says %s of data but %s has %s%d after the %d-byte header", name,
        size_str, content, trailing >= kMaxTrailingCount ? "more than " : "", expected + trailing,
        header_bytes));
  }
  return out;
}

// Opens `path` as a byte stream, decompressing when it starts with the gzip magic (1f 8b; an IDX
// header starts with 00 00, so the two cannot be confused). `content` receives what the stream's
// byte counts refer to.
absl::StatusOr<std::unique_ptr<ByteSource>> OpenIdxSource(const std::string& path,
                                                          std::string* content) {
  KILN_ASSIGN_OR_RETURN(DataFile opened, OpenDataFile(path, "an IDX file"));
  FILE* file = opened.get();
  uint8_t head[2] = {0, 0};
  const size_t head_len = std::fread(head, 1, sizeof(head), file);
  const bool gzipped = head_len == 2 && head[0] == 0x1f && head[1] == 0x8b;
  if (!gzipped) {
    if (std::fseek(file, 0, SEEK_SET) != 0) {
      return absl::DataLossError(absl::StrCat(path, ": cannot seek: ", std::strerror(errno)));
    }
    *content = "file";
    return std::make_unique<PlainFileSource>(opened.release(), path);
  }
  // gzip reads the file through its own handle; `opened` closes at return.
  gzFile gz = gzopen(path.c_str(), "rb");
  if (gz == nullptr) {
    return absl::UnavailableError(
        absl::StrCat(path, ": cannot open as gzip: ", errno ? std::strerror(errno) : "no memory"));
  }
  gzbuffer(gz, 128 * 1024);
  *content = "decompressed file";
  return std::make_unique<GzipFileSource>(gz, path);
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path) {
  std::string content;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> src, OpenIdxSource(path, &content));
  return ParseIdxStream(*src, path, content);
}

absl::StatusOr<std::vector<int64_t>> ReadIdxFileDims(const std::string& path) {
  std::string content;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> src, OpenIdxSource(path, &content));
  KILN_ASSIGN_OR_RETURN(IdxHeader header, ReadIdxHeader(*src, path, content));
  return std::move(header.dims);
}

absl::StatusOr<IdxArray> ParseIdx(std::string_view bytes, const std::string& name) {
  MemorySource src(bytes);
  return ParseIdxStream(src, name, "input");
}

}  // namespace kiln
