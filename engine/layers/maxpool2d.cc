#include "engine/layers/maxpool2d.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/layers/layer_rules.h"

namespace kiln {

absl::StatusOr<Shape> OutputShape(const MaxPool2dConfig& c, const Shape& in) {
  KILN_RETURN_IF_ERROR(CheckPositive("kernel_size", c.kernel_size));
  if (c.stride < 0) {
    return absl::InvalidArgumentError(absl::StrCat("stride must be >= 0, got ", c.stride));
  }
  KILN_RETURN_IF_ERROR(CheckImageInput("maxpool2d", in));
  const int64_t s = c.stride > 0 ? c.stride : c.kernel_size;
  if (c.kernel_size > in[1] || c.kernel_size > in[2]) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel_size ", c.kernel_size, " is larger than the input ", ShapeString(in)));
  }
  return Shape{in[0], (in[1] - c.kernel_size) / s + 1, (in[2] - c.kernel_size) / s + 1};
}

absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const MaxPool2dConfig& c,
                                                 const LayerContext& ctx) {
  return std::make_unique<MaxPool2d>(c, ctx.backend, ctx.input, ctx.output);
}

Pool2dGeometry MaxPool2d::Geometry(int64_t batch) const {
  Pool2dGeometry g;
  g.batch = static_cast<int>(batch);
  g.channels = static_cast<int>(input_shape_[0]);
  g.in_h = static_cast<int>(input_shape_[1]);
  g.in_w = static_cast<int>(input_shape_[2]);
  g.kernel = static_cast<int>(config_.kernel_size);
  g.stride = static_cast<int>(config_.stride > 0 ? config_.stride : config_.kernel_size);
  return g;
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
