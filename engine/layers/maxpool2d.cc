#include "engine/layers/maxpool2d.h"

#include "engine/status_macros.h"

namespace kiln {

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
