// Flatten: (B, C, H, W) -> (B, C*H*W); the data do not move.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/layers/layer.h"
#include "engine/model/model_config.h"

namespace kiln {

// Every element of the input in one dimension; no parameters.
inline absl::StatusOr<Shape> OutputShape(const FlattenConfig&, const Shape& input) {
  return Shape{NumElements(input)};
}
inline int64_t ParameterCount(const FlattenConfig&) { return 0; }
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const FlattenConfig& c, const LayerContext& ctx);

class Flatten final : public Layer {
 public:
  Flatten(Backend* backend, const Shape& input) : Layer(backend, input, {NumElements(input)}) {}
  const char* type() const override { return "flatten"; }
  absl::Status Forward(const Tensor& x, Tensor* y, Mode mode) override;
  absl::Status Backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;
};

}  // namespace kiln
