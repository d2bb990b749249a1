// The element-wise activation layers besides ReLU: tanh, sigmoid, gelu (exact), leaky_relu and
// silu, PyTorch's formulas (engine/backend.h's ActivationKind). One layer class runs them all
// through the backend's ActivationForward and ActivationBackward.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/layers/layer.h"
#include "engine/model/model_config.h"

namespace kiln {

// Each keeps its input's shape and has no parameters; leaky_relu's negative_slope must be finite.
inline absl::StatusOr<Shape> OutputShape(const TanhConfig&, const Shape& in) { return in; }
inline absl::StatusOr<Shape> OutputShape(const SigmoidConfig&, const Shape& in) { return in; }
inline absl::StatusOr<Shape> OutputShape(const GeluConfig&, const Shape& in) { return in; }
absl::StatusOr<Shape> OutputShape(const LeakyReluConfig& c, const Shape& in);
inline absl::StatusOr<Shape> OutputShape(const SiluConfig&, const Shape& in) { return in; }
inline int64_t ParameterCount(const TanhConfig&) { return 0; }
inline int64_t ParameterCount(const SigmoidConfig&) { return 0; }
inline int64_t ParameterCount(const GeluConfig&) { return 0; }
inline int64_t ParameterCount(const LeakyReluConfig&) { return 0; }
inline int64_t ParameterCount(const SiluConfig&) { return 0; }
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const TanhConfig& c, const LayerContext& ctx);
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const SigmoidConfig& c, const LayerContext& ctx);
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const GeluConfig& c, const LayerContext& ctx);
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const LeakyReluConfig& c, const LayerContext& ctx);
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const SiluConfig& c, const LayerContext& ctx);

// "tanh", "sigmoid", "gelu", "leaky_relu", "silu".
const char* ActivationKindName(ActivationKind kind);

class ElementwiseActivation final : public Layer {
 public:
  // `param` is leaky ReLU's negative slope (unused by the others).
  ElementwiseActivation(ActivationKind kind, float param, Backend* backend, const Shape& shape)
      : Layer(backend, shape, shape), kind_(kind), param_(param) {}
  const char* type() const override { return ActivationKindName(kind_); }
  // Element-wise: each position on its own.
  Incremental incremental() const override { return Incremental::kPositionWise; }
  absl::Status Forward(const Tensor& x, Tensor* y, Mode mode) override;
  absl::Status Backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;

 private:
  ActivationKind kind_;
  float param_;
};

}  // namespace kiln
