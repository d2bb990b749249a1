#include "engine/layers/activation.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace kiln {

absl::StatusOr<Shape> OutputShape(const LeakyReluConfig& c, const Shape& in) {
  if (!std::isfinite(c.negative_slope)) {
    return absl::InvalidArgumentError(
        absl::StrCat("negative_slope must be finite, got ", c.negative_slope));
  }
  return in;
}

namespace {
std::unique_ptr<Layer> Make(ActivationKind kind, float param, const LayerContext& ctx) {
  return std::make_unique<ElementwiseActivation>(kind, param, ctx.backend, ctx.input);
}
}  // namespace

absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const TanhConfig&, const LayerContext& ctx) {
  return Make(ActivationKind::kTanh, 0.0f, ctx);
}
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const SigmoidConfig&, const LayerContext& ctx) {
  return Make(ActivationKind::kSigmoid, 0.0f, ctx);
}
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const GeluConfig&, const LayerContext& ctx) {
  return Make(ActivationKind::kGelu, 0.0f, ctx);
}
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const LeakyReluConfig& c,
                                                 const LayerContext& ctx) {
  return Make(ActivationKind::kLeakyRelu, c.negative_slope, ctx);
}
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const SiluConfig&, const LayerContext& ctx) {
  return Make(ActivationKind::kSilu, 0.0f, ctx);
}

const char* ActivationKindName(ActivationKind kind) {
  switch (kind) {
    case ActivationKind::kTanh:
      return "tanh";
    case ActivationKind::kSigmoid:
      return "sigmoid";
    case ActivationKind::kGelu:
      return "gelu";
    case ActivationKind::kLeakyRelu:
      return "leaky_relu";
    case ActivationKind::kSilu:
      return "silu";
  }
  return "activation";
}

absl::Status ElementwiseActivation::Forward(const Tensor& x, Tensor* y, Mode) {
  return backend_->ActivationForward(kind_, param_, x.numel(), x.f32(), y->f32());
}

absl::Status ElementwiseActivation::Backward(const Tensor& x, const Tensor& y, const Tensor& dy,
                                             Tensor* dx) {
  if (dx == nullptr) return absl::OkStatus();
  return backend_->ActivationBackward(kind_, param_, x.numel(), x.f32(), y.f32(), dy.f32(),
                                      dx->f32());
}

}  // namespace kiln
