// Flatten: (B, C, H, W) -> (B, C*H*W); the data do not move.
#pragma once

#include "engine/layers/layer.h"

namespace kiln {

class Flatten final : public Layer {
 public:
  Flatten(Backend* backend, const Shape& input)
      : Layer(backend, input, {NumElements(input)}) {}
  const char* type() const override { return "flatten"; }
  absl::Status Forward(const Tensor& x, Tensor* y, Mode mode) override;
  absl::Status Backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;
};

}  // namespace kiln
