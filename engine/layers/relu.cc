#include "engine/layers/relu.h"

namespace kiln {

absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const ReluConfig&, const LayerContext& ctx) {
  return std::make_unique<Relu>(ctx.backend, ctx.input);
}

absl::Status Relu::Forward(const Tensor& x, Tensor* y, Mode) {
  return backend_->ReluForward(x.numel(), x.f32(), y->f32());
}

absl::Status Relu::Backward(const Tensor&, const Tensor& y, const Tensor& dy, Tensor* dx) {
  if (dx == nullptr) return absl::OkStatus();
  return backend_->ReluBackward(y.numel(), y.f32(), dy.f32(), dx->f32());
}

}  // namespace kiln
