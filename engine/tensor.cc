#include "engine/tensor.h"

#include <utility>

namespace kiln {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kU8:
      return 1;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kI32:
      return "I32";
    case DType::kU8:
      return "U8";
  }
  return "?";
}

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const Shape& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += 'x';
    s += std::to_string(shape[i]);
  }
  return s.empty() ? "scalar" : s;
}

Tensor::Tensor(std::shared_ptr<Buffer> buffer, DType dtype, Shape shape)
    : buffer_(std::move(buffer)), dtype_(dtype), shape_(std::move(shape)) {}

bool Tensor::Reshape(Shape shape) {
  if (static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype_) > capacity_bytes()) return false;
  shape_ = std::move(shape);
  return true;
}

}  // namespace kiln
