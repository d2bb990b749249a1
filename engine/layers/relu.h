// ReLU: y = max(x, 0), element-wise.
#pragma once

#include "engine/layers/layer.h"

namespace kiln {

class Relu final : public Layer {
 public:
  Relu(Backend* backend, const Shape& shape) : Layer(backend, shape, shape) {}
  const char* type() const override { return "relu"; }
  absl::Status Forward(const Tensor& x, Tensor* y, Mode mode) override;
  absl::Status Backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;
};

}  // namespace kiln
