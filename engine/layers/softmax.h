// Softmax over the last dimension, for models that output probabilities when served.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/layers/layer.h"
#include "engine/model/model_config.h"

namespace kiln {

// A flat input's shape; no parameters.
absl::StatusOr<Shape> OutputShape(const SoftmaxConfig& c, const Shape& input);
inline int64_t ParameterCount(const SoftmaxConfig&) { return 0; }
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const SoftmaxConfig& c, const LayerContext& ctx);

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
