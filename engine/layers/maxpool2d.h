// MaxPool2d: the maximum over each kernel x kernel window (floor mode, no padding).
#pragma once

#include "engine/layers/layer.h"
#include "engine/model_config.h"

namespace kiln {

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
