#include "engine/layers/dropout.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kiln {

absl::StatusOr<Shape> OutputShape(const DropoutConfig& c, const Shape& in) {
  if (!(c.p >= 0.0f && c.p < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("p must be in [0, 1), got ", c.p));
  }
  return in;
}

absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const DropoutConfig& c, const LayerContext& ctx) {
  return std::make_unique<Dropout>(c, ctx.backend, ctx.input, ctx.stream_seed);
}

absl::Status Dropout::Forward(const Tensor& x, Tensor* y, Mode mode) {
  if (mode == Mode::kEval || config_.p == 0.0f) return backend_->Copy(x, y, x.bytes());
  if (!mask_.Reshape(x.shape())) {
    KILN_ASSIGN_OR_RETURN(mask_, backend_->Allocate(DType::kF32, x.shape()));
  }
  KILN_RETURN_IF_ERROR(backend_->DropoutForward(x.numel(), config_.p, seed_, offset_, x.f32(),
                                                mask_.f32(), y->f32()));
  offset_ += static_cast<uint64_t>(x.numel());
  return absl::OkStatus();
}

absl::Status Dropout::Backward(const Tensor&, const Tensor&, const Tensor& dy, Tensor* dx) {
  if (dx == nullptr) return absl::OkStatus();
  if (config_.p == 0.0f) return backend_->Copy(dy, dx, dy.bytes());
  return backend_->DropoutBackward(dy.numel(), mask_.f32(), dy.f32(), dx->f32());
}

}  // namespace kiln
