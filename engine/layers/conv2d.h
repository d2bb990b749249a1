// Conv2d: kernel, stride and zero padding per axis (square by default), weight (out, in, kh, kw)
// as in torch.nn.Conv2d.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/layers/layer.h"
#include "engine/model/model_config.h"
#include "engine/rng.h"

namespace kiln {

// Output (out_channels, H', W') for a (in_channels, H, W) input, floor((H + 2ph - kh) / sh) + 1
// and likewise for W.
absl::StatusOr<Shape> OutputShape(const Conv2dConfig& c, const Shape& input);
int64_t ParameterCount(const Conv2dConfig& c);
// The backend's view of a conv2d layer over `batch` samples of `input` (in_channels, H, W): what
// the layer runs and what the memory plan sizes its workspace by.
Conv2dGeometry MakeConv2dGeometry(const Conv2dConfig& c, const Shape& input, int64_t batch);
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const Conv2dConfig& c, const LayerContext& ctx);

class Conv2d final : public Layer {
 public:
  // `act` is an activation fused into this layer (the model fuses a following ReLU);
  // `max_pool` > 0 a max pooling of that kernel size and stride fused after it, which the
  // layer's output (Forward's y) then is; `output` stays the convolution's. x_layout (of x and
  // dx) and y_layout (of y and dy): how the model keeps them (LayerContext).
  static absl::StatusOr<std::unique_ptr<Layer>> Create(const Conv2dConfig& config, Backend* backend,
                                                       const Shape& input, const Shape& output,
                                                       Rng* rng, Activation act = Activation::kNone,
                                                       int64_t max_pool = 0,
                                                       ImageLayout x_layout = ImageLayout::kNchw,
                                                       ImageLayout y_layout = ImageLayout::kNchw);
  const char* type() const override { return "conv2d"; }
  absl::Status Forward(const Tensor& x, Tensor* y, Mode mode) override;
  absl::Status Backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;
  std::vector<Parameter*> parameters() override;

 private:
  Conv2d(const Conv2dConfig& config, Backend* backend, const Shape& input, const Shape& output,
         Activation act, int64_t max_pool)
      : Layer(backend, input, output), config_(config), act_(act), max_pool_(max_pool) {}
  Conv2dGeometry Geometry(int64_t batch) const;
  Pool2dGeometry PoolGeometry(int64_t batch) const;
  Conv2dConfig config_;
  Activation act_;
  int64_t max_pool_;
  ImageLayout x_layout_ = ImageLayout::kNchw, y_layout_ = ImageLayout::kNchw;
  Parameter weight_, bias_;
  Tensor winners_;  // with a fused max pooling, its winners (Backend::Conv2dMaxPoolForward)
};

}  // namespace kiln
