// ReLU: y = max(x, 0), element-wise.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/layers/layer.h"
#include "engine/model/model_config.h"

namespace kiln {

// The same shape as its input; no parameters.
inline absl::StatusOr<Shape> OutputShape(const ReluConfig&, const Shape& input) { return input; }
inline int64_t ParameterCount(const ReluConfig&) { return 0; }
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const ReluConfig& c, const LayerContext& ctx);

class Relu final : public Layer {
 public:
  Relu(Backend* backend, const Shape& shape) : Layer(backend, shape, shape) {}
  const char* type() const override { return "relu"; }
  // Element-wise: each position on its own.
  Incremental incremental() const override { return Incremental::kPositionWise; }
  absl::Status Forward(const Tensor& x, Tensor* y, Mode mode) override;
  absl::Status Backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;
};

}  // namespace kiln
