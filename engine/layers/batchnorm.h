// BatchNorm2d and BatchNorm1d as in PyTorch: in training, normalise with the batch's mean and
// biased variance and update the running statistics (unbiased variance, momentum); in evaluation,
// normalise with the running statistics. Parameters weight (ones) and bias (zeros) when affine;
// buffers running_mean (zeros), running_var (ones) and num_batches_tracked (I64, 0).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/layers/layer.h"
#include "engine/model/model_config.h"

namespace kiln {

// The same shape as the input, which is num_features x H x W.
absl::StatusOr<Shape> OutputShape(const BatchNorm2dConfig& c, const Shape& input);
// The same shape as the input, which is num_features or num_features x L.
absl::StatusOr<Shape> OutputShape(const BatchNorm1dConfig& c, const Shape& input);
inline int64_t ParameterCount(const BatchNormFields& c) {
  return c.affine ? 2 * c.num_features : 0;
}
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const BatchNorm2dConfig& c,
                                                 const LayerContext& ctx);
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const BatchNorm1dConfig& c,
                                                 const LayerContext& ctx);

class BatchNorm final : public Layer {
 public:
  // `type` is "batchnorm2d" or "batchnorm1d"; `shape` the per-sample input (and output) shape,
  // whose first dimension is the channel; `layout` how the model keeps x, y and their gradients
  // (a batchnorm2d's may be nChw16c); `act` a ReLU the model fused after it
  // (Backend::FusesBatchNormRelu), which Forward's y then is.
  static absl::StatusOr<std::unique_ptr<Layer>> Create(const char* type, const BatchNormFields& c,
                                                       Backend* backend, const Shape& shape,
                                                       ImageLayout layout = ImageLayout::kNchw,
                                                       Activation act = Activation::kNone);
  const char* type() const override { return type_; }
  absl::Status Forward(const Tensor& x, Tensor* y, Mode mode) override;
  absl::Status Backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;
  std::vector<Parameter*> parameters() override;
  std::vector<StateBuffer*> buffers() override;

 private:
  BatchNorm(const char* type, const BatchNormFields& c, Backend* backend, const Shape& shape)
      : Layer(backend, shape, shape), type_(type), config_(c) {}
  BatchNormGeometry Geometry(const Tensor& x) const;
  // "batchnorm1d(num_features=4): ", for messages.
  std::string Where() const;

  const char* type_;
  BatchNormFields config_;
  ImageLayout layout_ = ImageLayout::kNchw;
  Activation act_ = Activation::kNone;
  Parameter weight_, bias_;
  StateBuffer running_mean_, running_var_, num_batches_tracked_;
  // The last training pass's statistics per channel, for Backward.
  Tensor saved_mean_, saved_invstd_;
  // Without affine: a fixed gamma of ones, beta of zeros, and where their gradients go.
  Tensor fixed_gamma_, fixed_beta_, unused_grads_;
};

}  // namespace kiln
