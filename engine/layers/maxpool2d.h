// MaxPool2d: the maximum over each kernel x kernel window (floor mode); padded positions never win.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/layers/layer.h"
#include "engine/model/model_config.h"

namespace kiln {

// Output (C, H', W') for a (C, H, W) input, floor((H + 2p - k) / stride) + 1 (Pool2dOutputShape);
// no parameters.
absl::StatusOr<Shape> OutputShape(const MaxPool2dConfig& c, const Shape& input);
inline int64_t ParameterCount(const MaxPool2dConfig&) { return 0; }
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const MaxPool2dConfig& c, const LayerContext& ctx);

class MaxPool2d final : public Layer {
 public:
  MaxPool2d(const MaxPool2dConfig& config, Backend* backend, const Shape& input,
            const Shape& output)
      : Layer(backend, input, output), config_(config) {}
  const char* type() const override { return "maxpool2d"; }
  absl::Status Forward(const Tensor& x, Tensor* y, Mode mode) override;
  absl::Status Backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

 private:
  Pool2dGeometry Geometry(int64_t batch) const;
  MaxPool2dConfig config_;
  Tensor argmax_;  // int32, the winner of each output window, grown to the largest batch
};

}  // namespace kiln
