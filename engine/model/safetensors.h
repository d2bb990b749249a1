// Reads and writes safetensors files (Hugging Face's format) holding named host-memory tensors.
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON header (space-padded to a
// multiple of 8), then the tensors' raw little-endian bytes, contiguous and in header order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/tensor.h"

namespace kiln {

// The element types kiln stores. I64/U64 carry optimizer step counts and RNG state.
enum class SafetensorDType { kF32, kI32, kU8, kI64, kU64 };

size_t SafetensorDTypeSize(SafetensorDType dtype);
// "F32", "I32", "U8", "I64", "U64": the spelling in the file header.
const char* SafetensorDTypeName(SafetensorDType dtype);
SafetensorDType ToSafetensorDType(DType dtype);

// One tensor in host memory, named as in PyTorch's state_dict ("0.weight"). `bytes` holds
// NumElements(shape) * SafetensorDTypeSize(dtype) bytes, row-major, little-endian.
struct HostTensor {
  std::string name;
  SafetensorDType dtype = SafetensorDType::kF32;
  Shape shape;
  std::vector<uint8_t> bytes;
};

// Copies NumElements(shape) floats from `data` (which may be null only for zero elements).
HostTensor HostTensorFromF32(std::string name, const float* data, const Shape& shape);
// A 1-D U64 tensor of values.size() elements.
HostTensor HostTensorFromU64(std::string name, const std::vector<uint64_t>& values);
// A 1-D I64 tensor of values.size() elements.
HostTensor HostTensorFromI64(std::string name, const std::vector<int64_t>& values);

// Copies an F32 tensor into `out` (room for NumElements(shape) floats); InvalidArgument naming the
// tensor when its dtype is not F32 or its shape is not `shape`.
absl::Status CopyF32(const HostTensor& tensor, const Shape& shape, float* out);
// The elements (row-major) of a U64 / I64 tensor; InvalidArgument naming the tensor otherwise.
absl::StatusOr<std::vector<uint64_t>> ToU64Values(const HostTensor& tensor);
absl::StatusOr<std::vector<int64_t>> ToI64Values(const HostTensor& tensor);

// A whole file: tensors in data-section order, plus the "__metadata__" strings.
struct SafetensorsContents {
  std::vector<HostTensor> tensors;
  std::map<std::string, std::string> metadata;

  // The tensor called `name`, or null. Linear in the number of tensors.
  const HostTensor* Find(std::string_view name) const;
};

// Writes `tensors` (in the given order) and `metadata` to `path` atomically: to
// PATH.tmp.<pid>.<random> in the same directory, fsync, rename over PATH, fsync the directory.
// The output is deterministic: the same inputs give the same bytes. InvalidArgument (and nothing
// written) for an empty, duplicate or "__metadata__" name, a negative dim, a byte count that does
// not match shape and dtype, or a name or metadata string that is not UTF-8. On any I/O failure
// before the rename the previous file at PATH is untouched and the temp file removed; the status
// names the path, the failing step ("open", "write", "fsync", "close", "rename") and strerror.
// A failed fsync of the directory after the rename is reported too, with the new file in place.
absl::Status WriteSafetensors(const std::string& path, const std::vector<HostTensor>& tensors,
                              const std::map<std::string, std::string>& metadata);

// The pid in the name of a temp file WriteSafetensors makes (FILE.tmp.<pid>.<16 hex digits>), or
// -1 when `file_name` is not one: how a later process tells a dead writer's leftover.
int SafetensorsTempWriterPid(std::string_view file_name);

// Reads and fully validates the file at `path`. NotFound for a missing file; DataLoss for a
// truncated or otherwise corrupt file; InvalidArgument for a malformed header or one using a
// dtype kiln does not store. Every message names the file.
absl::StatusOr<SafetensorsContents> ReadSafetensors(const std::string& path);

// Same as ReadSafetensors, from the bytes of a whole file in memory (for fuzzing and uploads);
// `what` names the source in messages.
absl::StatusOr<SafetensorsContents> ParseSafetensors(std::string_view bytes, std::string_view what);

// Headers longer than this are rejected, as the reference implementation does.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

}  // namespace kiln
