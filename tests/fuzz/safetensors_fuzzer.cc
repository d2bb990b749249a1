// Fuzzes the safetensors reader (ParseSafetensors), then writes what it accepted back with
// WriteSafetensors and reads that file again.
//
// Oracle: errors are InvalidArgument or DataLoss, as documented; an accepted file has unique
// tensor names, each with exactly the bytes its shape and dtype need; and whatever was accepted
// is written back without complaint and read back identical (a checkpoint kiln can load, kiln
// can also save).
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/safetensors.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/scratch_file.h"

namespace kiln {
namespace {

void CheckWellFormed(const SafetensorsContents& contents) {
  std::set<std::string> names;
  for (const HostTensor& t : contents.tensors) {
    KILN_FUZZ_CHECK(names.insert(t.name).second, "tensor \"%s\" accepted twice", t.name.c_str());
    KILN_FUZZ_CHECK(t.name != "__metadata__", "a tensor called __metadata__ was accepted");
    uint64_t bytes = SafetensorDTypeSize(t.dtype);
    for (int64_t d : t.shape) {
      KILN_FUZZ_CHECK(d >= 0, "tensor \"%s\": negative dim", t.name.c_str());
      KILN_FUZZ_CHECK(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes),
                      "tensor \"%s\": a shape whose byte count overflows was accepted",
                      t.name.c_str());
    }
    KILN_FUZZ_CHECK(bytes == t.bytes.size(), "tensor \"%s\": shape needs %llu bytes, has %zu",
                    t.name.c_str(), static_cast<unsigned long long>(bytes), t.bytes.size());
  }
}

bool SameTensor(const HostTensor& a, const HostTensor& b) {
  return a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.bytes == b.bytes;
}

void CheckRoundTrip(const SafetensorsContents& contents) {
  const fuzz::ScratchFile& file = fuzz::ScratchFile::Get("roundtrip.safetensors");
  const absl::Status written = WriteSafetensors(file.path(), contents.tensors, contents.metadata);
  KILN_FUZZ_CHECK(written.ok(), "an accepted file cannot be written back: %s",
                  written.ToString().c_str());
  const absl::StatusOr<SafetensorsContents> reread = ReadSafetensors(file.path());
  KILN_FUZZ_CHECK(reread.ok(), "a written file cannot be read back: %s",
                  reread.status().ToString().c_str());
  KILN_FUZZ_CHECK(reread->metadata == contents.metadata, "metadata changed in the round trip");
  KILN_FUZZ_CHECK(reread->tensors.size() == contents.tensors.size(),
                  "%zu tensors written, %zu read back", contents.tensors.size(),
                  reread->tensors.size());
  for (size_t i = 0; i < contents.tensors.size(); ++i) {
    KILN_FUZZ_CHECK(SameTensor(reread->tensors[i], contents.tensors[i]),
                    "tensor %zu (\"%s\") changed in the round trip", i,
                    contents.tensors[i].name.c_str());
  }
}

}  // namespace
}  // namespace kiln

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<kiln::SafetensorsContents> parsed =
      kiln::ParseSafetensors(bytes, "fuzz input");
  if (!parsed.ok()) {
    const absl::StatusCode code = parsed.status().code();
    KILN_FUZZ_CHECK(
        code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kDataLoss,
        "undocumented error %s", parsed.status().ToString().c_str());
    return 0;
  }
  kiln::CheckWellFormed(*parsed);
  kiln::CheckRoundTrip(*parsed);
  return 0;
}
