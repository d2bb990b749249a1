#include "engine/layers/maxpool2d.h"

#include "common/status_macros.h"
#include "engine/layers/pool2d_rules.h"

namespace kiln {

absl::StatusOr<Shape> OutputShape(const MaxPool2dConfig& c, const Shape& in) {
  return Pool2dOutputShape("maxpool2d", c.kernel_size, c.stride, c.padding, in);
}

absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const MaxPool2dConfig& c,
                                                 const LayerContext& ctx) {
  return std::make_unique<MaxPool2d>(c, ctx.backend, ctx.input, ctx.output);
}

Pool2dGeometry MaxPool2d::Geometry(int64_t batch) const {
  return MakePool2dGeometry(config_.kernel_size, config_.stride, config_.padding, input_shape_,
                            batch);
}

absl::Status MaxPool2d::Forward(const Tensor& x, Tensor* y, Mode) {
  if (!argmax_.Reshape(y->shape())) {
    KILN_ASSIGN_OR_RETURN(argmax_, backend_->Allocate(DType::kI32, y->shape()));
  }
  return backend_->MaxPool2dForward(Geometry(x.dim(0)), x.f32(), y->f32(), argmax_.i32());
}

absl::Status MaxPool2d::Backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) {
  if (dx == nullptr) return absl::OkStatus();
  return backend_->MaxPool2dBackward(Geometry(x.dim(0)), dy.f32(), argmax_.i32(), dx->f32());
}

}  // namespace kiln
