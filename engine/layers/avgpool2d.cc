#include "engine/layers/avgpool2d.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/layers/layer_rules.h"
#include "engine/layers/pool2d_rules.h"

namespace kiln {

absl::StatusOr<Shape> OutputShape(const AvgPool2dConfig& c, const Shape& in) {
  return Pool2dOutputShape("avgpool2d", c.kernel_size, c.stride, c.padding, in);
}

absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const AvgPool2dConfig& c,
                                                 const LayerContext& ctx) {
  Pool2dGeometry window =
      MakePool2dGeometry(c.kernel_size, c.stride, c.padding, ctx.input, /*batch=*/0);
  window.layout = ctx.input_layout;
  return std::make_unique<AvgPool2d>("avgpool2d", window, ctx.backend, ctx.input, ctx.output);
}

absl::StatusOr<Shape> OutputShape(const AdaptiveAvgPool2dConfig& c, const Shape& in) {
  KILN_RETURN_IF_ERROR(CheckPositive("output_h", c.output_h));
  KILN_RETURN_IF_ERROR(CheckPositive("output_w", c.output_w));
  KILN_RETURN_IF_ERROR(CheckImageInput("adaptive_avgpool2d", in));
  if (in[1] % c.output_h != 0 || in[2] % c.output_w != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output size ", c.output_h, "x", c.output_w, " does not divide the input ", in[1], "x",
        in[2],
        " evenly; only output sizes whose sides divide the input's are supported (1x1, "
        "global average pooling, always does)"));
  }
  return Shape{in[0], c.output_h, c.output_w};
}

absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const AdaptiveAvgPool2dConfig& c,
                                                 const LayerContext& ctx) {
  // PyTorch's adaptive window of output i spans [floor(i H / OH), ceil((i + 1) H / OH)): with
  // H a multiple of OH, exactly the window H / OH wide at stride H / OH.
  Pool2dGeometry window;
  window.channels = static_cast<int>(ctx.input[0]);
  window.in_h = static_cast<int>(ctx.input[1]);
  window.in_w = static_cast<int>(ctx.input[2]);
  window.kernel_h = window.stride_h = static_cast<int>(ctx.input[1] / c.output_h);
  window.kernel_w = window.stride_w = static_cast<int>(ctx.input[2] / c.output_w);
  window.padding_h = window.padding_w = 0;
  window.layout = ctx.input_layout;
  return std::make_unique<AvgPool2d>("adaptive_avgpool2d", window, ctx.backend, ctx.input,
                                     ctx.output);
}

Pool2dGeometry AvgPool2d::Geometry(int64_t batch) const {
  Pool2dGeometry g = window_;
  g.batch = static_cast<int>(batch);
  return g;
}

absl::Status AvgPool2d::Forward(const Tensor& x, Tensor* y, Mode) {
  return backend_->AvgPool2dForward(Geometry(x.dim(0)), x.f32(), y->f32());
}

absl::Status AvgPool2d::Backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) {
  if (dx == nullptr) return absl::OkStatus();
  return backend_->AvgPool2dBackward(Geometry(x.dim(0)), dy.f32(), dx->f32());
}

}  // namespace kiln
