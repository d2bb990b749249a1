// Softmax over the last dimension, for models that output probabilities when served.
#pragma once

#include "engine/layers/layer.h"

namespace kiln {

class Softmax final : public Layer {
 public:
  Softmax(Backend* backend, const Shape& shape) : Layer(backend, shape, shape) {}
  const char* type() const override { return "softmax"; }
  absl::Status Forward(const Tensor& x, Tensor* y, Mode mode) override;
  // Backpropagating through softmax is not needed for training (the loss is fused with
  // log-softmax); it is supported for completeness: dx = y * (dy - sum(dy * y)).
  absl::Status Backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;
};

}  // namespace kiln
