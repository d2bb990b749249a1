#include "engine/layers/flatten.h"

namespace kiln {

absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const FlattenConfig&, const LayerContext& ctx) {
  return std::make_unique<Flatten>(ctx.backend, ctx.input);
}

absl::Status Flatten::Forward(const Tensor& x, Tensor* y, Mode) {
  return backend_->Copy(x, y, x.bytes());
}

absl::Status Flatten::Backward(const Tensor&, const Tensor&, const Tensor& dy, Tensor* dx) {
  if (dx == nullptr) return absl::OkStatus();
  return backend_->Copy(dy, dx, dy.bytes());
}

}  // namespace kiln
