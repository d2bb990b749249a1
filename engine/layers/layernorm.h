// Layer normalisation over the last dimension, as torch.nn.LayerNorm(normalized_shape, eps,
// elementwise_affine, bias): each position's normalized_shape values get their own mean and
// biased variance. Parameters weight (ones) when affine, and bias (zeros) when affine and bias.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/layers/layer.h"
#include "engine/model/model_config.h"

namespace kiln {

// The same shape as the input, of any rank >= 1, whose last dimension is normalized_shape.
absl::StatusOr<Shape> OutputShape(const LayerNormConfig& c, const Shape& input);
int64_t ParameterCount(const LayerNormConfig& c);
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const LayerNormConfig& c, const LayerContext& ctx);

class LayerNorm final : public Layer {
 public:
  static absl::StatusOr<std::unique_ptr<Layer>> Create(const LayerNormConfig& c, Backend* backend,
                                                       const Shape& shape);
  const char* type() const override { return "layernorm"; }
  // Over each position's features when the sample is (T, ..., normalized_shape).
  Incremental incremental() const override {
    return input_shape_.size() >= 2 ? Incremental::kPositionWise : Incremental::kUnsupported;
  }
  absl::Status Forward(const Tensor& x, Tensor* y, Mode mode) override;
  absl::Status Backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;
  std::vector<Parameter*> parameters() override;

 private:
  LayerNorm(const LayerNormConfig& c, Backend* backend, const Shape& shape)
      : Layer(backend, shape, shape), config_(c) {}
  int64_t Rows(const Tensor& x) const { return x.numel() / config_.normalized_shape; }

  LayerNormConfig config_;
  Parameter weight_, bias_;
  // The last forward's statistics per row (batch x positions), for Backward.
  Tensor mean_, rstd_;
};

}  // namespace kiln
