// Average pooling: AvgPool2d (square windows, padding counted as zeros as in PyTorch's
// count_include_pad=True) and AdaptiveAvgPool2d (the windows that reach a given output size;
// global average pooling at 1x1). Both run as one layer over a Pool2dGeometry.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/layers/layer.h"
#include "engine/model/model_config.h"

namespace kiln {

// Output (C, H', W') for a (C, H, W) input, floor((H + 2p - k) / stride) + 1 (Pool2dOutputShape);
// no parameters.
absl::StatusOr<Shape> OutputShape(const AvgPool2dConfig& c, const Shape& input);
inline int64_t ParameterCount(const AvgPool2dConfig&) { return 0; }
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const AvgPool2dConfig& c, const LayerContext& ctx);

// Output (C, output_h, output_w); each input side must be a multiple of the output side, which
// makes PyTorch's adaptive windows all input / output wide and apart. No parameters.
absl::StatusOr<Shape> OutputShape(const AdaptiveAvgPool2dConfig& c, const Shape& input);
inline int64_t ParameterCount(const AdaptiveAvgPool2dConfig&) { return 0; }
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const AdaptiveAvgPool2dConfig& c,
                                                 const LayerContext& ctx);

class AvgPool2d final : public Layer {
 public:
  // `window` is the geometry for any batch (its batch is replaced); `type` names the layer.
  AvgPool2d(const char* type, const Pool2dGeometry& window, Backend* backend, const Shape& input,
            const Shape& output)
      : Layer(backend, input, output), type_(type), window_(window) {}
  const char* type() const override { return type_; }
  absl::Status Forward(const Tensor& x, Tensor* y, Mode mode) override;
  absl::Status Backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

 private:
  Pool2dGeometry Geometry(int64_t batch) const;
  const char* type_;
  Pool2dGeometry window_;
};

}  // namespace kiln
