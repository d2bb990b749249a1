// Fuzzes the IDX reader three ways with the same bytes: parsed in memory (ParseIdx), read from a
// file (ReadIdxFile: raw, or gzip when the bytes start with 1f 8b), and gzip-compressed into a
// file, so the decompressing reader sees every header and payload the fuzzer makes up.
//
// Oracle: an accepted array has rank 1..4, dims > 0 and exactly their product of bytes; the
// raw file and the gzip file give the same array, or an error with the same code, as memory.
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/data/idx_reader.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/scratch_file.h"

namespace kiln {
namespace {

void CheckWellFormed(const absl::StatusOr<IdxArray>& array, const char* how) {
  if (!array.ok()) {
    KILN_FUZZ_CHECK(!array.status().message().empty(), "%s: an error without a message", how);
    return;
  }
  KILN_FUZZ_CHECK(!array->dims.empty() && array->dims.size() <= 4, "%s: rank %zu", how,
                  array->dims.size());
  int64_t elements = 1;
  for (int64_t d : array->dims) {
    KILN_FUZZ_CHECK(d > 0, "%s: dimension %lld", how, static_cast<long long>(d));
    elements *= d;
  }
  KILN_FUZZ_CHECK(elements <= kMaxIdxElements, "%s: %lld elements", how,
                  static_cast<long long>(elements));
  KILN_FUZZ_CHECK(static_cast<size_t>(elements) == array->data.size(),
                  "%s: dims hold %lld elements but data has %zu bytes", how,
                  static_cast<long long>(elements), array->data.size());
}

void CheckSame(const absl::StatusOr<IdxArray>& expected, const absl::StatusOr<IdxArray>& got,
               const char* how) {
  KILN_FUZZ_CHECK(expected.status().code() == got.status().code(),
                  "%s: \"%s\" but in memory \"%s\"", how, got.status().ToString().c_str(),
                  expected.status().ToString().c_str());
  if (!expected.ok()) return;
  KILN_FUZZ_CHECK(expected->dims == got->dims && expected->data == got->data,
                  "%s: a different array than in memory", how);
}

// `bytes` as a gzip stream (header, deflate, crc32 and length trailer).
std::string Gzip(std::string_view bytes) {
  z_stream z{};
  // windowBits 15 + 16: a gzip wrapper rather than zlib's.
  KILN_FUZZ_CHECK(deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK,
                  "deflateInit2 failed");
  std::string out(deflateBound(&z, bytes.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = static_cast<uInt>(bytes.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  KILN_FUZZ_CHECK(deflate(&z, Z_FINISH) == Z_STREAM_END, "deflate did not finish");
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

absl::StatusOr<IdxArray> ReadAsFile(std::string_view bytes) {
  const fuzz::ScratchFile& file = fuzz::ScratchFile::Get("input.idx");
  const absl::Status written = file.Write(bytes);
  KILN_FUZZ_CHECK(written.ok(), "%s", written.ToString().c_str());
  return ReadIdxFile(file.path());
}

}  // namespace
}  // namespace kiln

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<kiln::IdxArray> in_memory = kiln::ParseIdx(bytes, "fuzz input");
  kiln::CheckWellFormed(in_memory, "in memory");

  const absl::StatusOr<kiln::IdxArray> as_file = kiln::ReadAsFile(bytes);
  kiln::CheckWellFormed(as_file, "as a file");
  const bool gzip_magic = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  if (!gzip_magic) kiln::CheckSame(in_memory, as_file, "raw file");

  const absl::StatusOr<kiln::IdxArray> gzipped = kiln::ReadAsFile(kiln::Gzip(bytes));
  kiln::CheckWellFormed(gzipped, "gzip file");
  kiln::CheckSame(in_memory, gzipped, "gzip file");
  return 0;
}
