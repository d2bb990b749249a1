// A dense float32/int32/uint8 array in row-major (NCHW for images) order, on one backend's memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kiln {

enum class DType { kF32, kI32, kU8 };

size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);  // "F32", "I32", "U8": the safetensors spelling.

// Dimensions, outermost first. A per-sample shape leaves out the batch dimension.
using Shape = std::vector<int64_t>;

int64_t NumElements(const Shape& shape);
// "64x5x5"
std::string ShapeString(const Shape& shape);

// Raw memory owned by a backend; freed (or returned to its cache) by the deleter.
struct Buffer {
  void* data = nullptr;
  size_t bytes = 0;
};

// A shaped view over a Buffer. Copies share the buffer. The shape may shrink and grow again within
// the buffer's capacity (a smaller last batch) without reallocating.
class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Buffer> buffer, DType dtype, Shape shape);

  bool empty() const { return buffer_ == nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_[i]; }
  size_t rank() const { return shape_.size(); }
  int64_t numel() const { return NumElements(shape_); }
  size_t bytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }
  size_t capacity_bytes() const { return buffer_ ? buffer_->bytes : 0; }

  // Changes the shape; false (and no change) when it would not fit the buffer.
  bool Reshape(Shape shape);

  void* raw() const { return buffer_ ? buffer_->data : nullptr; }
  float* f32() const { return static_cast<float*>(raw()); }
  int32_t* i32() const { return static_cast<int32_t*>(raw()); }
  uint8_t* u8() const { return static_cast<uint8_t*>(raw()); }

 private:
  std::shared_ptr<Buffer> buffer_;
  DType dtype_ = DType::kF32;
  Shape shape_;
};

}  // namespace kiln
