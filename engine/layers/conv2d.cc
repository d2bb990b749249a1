#include "engine/layers/conv2d.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/layers/layer_rules.h"
#include "engine/layers/parameter_init.h"
#include "engine/layers/pool2d_rules.h"

namespace kiln {

namespace {

// "kernel_size 3" for a square kernel, "kernel 3x5" otherwise.
std::string DescribeKernel(const Conv2dConfig& c) {
  if (c.KernelH() == c.KernelW()) return absl::StrCat("kernel_size ", c.KernelH());
  return absl::StrCat("kernel ", c.KernelH(), "x", c.KernelW());
}

absl::Status CheckNonNegative(const char* field, int64_t v) {
  if (v >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " must be >= 0, got ", v));
}

}  // namespace

absl::StatusOr<Shape> OutputShape(const Conv2dConfig& c, const Shape& in) {
  KILN_RETURN_IF_ERROR(CheckPositive("in_channels", c.in_channels));
  KILN_RETURN_IF_ERROR(CheckPositive("out_channels", c.out_channels));
  // Each field named as the spec wrote it: the per-axis form where given.
  KILN_RETURN_IF_ERROR(CheckPositive(c.kernel_h ? "kernel_h" : "kernel_size", c.KernelH()));
  KILN_RETURN_IF_ERROR(CheckPositive(c.kernel_w ? "kernel_w" : "kernel_size", c.KernelW()));
  KILN_RETURN_IF_ERROR(CheckPositive(c.stride_h ? "stride_h" : "stride", c.StrideH()));
  KILN_RETURN_IF_ERROR(CheckPositive(c.stride_w ? "stride_w" : "stride", c.StrideW()));
  KILN_RETURN_IF_ERROR(CheckNonNegative(c.padding_h ? "padding_h" : "padding", c.PaddingH()));
  KILN_RETURN_IF_ERROR(CheckNonNegative(c.padding_w ? "padding_w" : "padding", c.PaddingW()));
  KILN_RETURN_IF_ERROR(CheckImageInput("conv2d", in));
  if (in[0] != c.in_channels) {
    return absl::InvalidArgumentError(absl::StrCat("in_channels ", c.in_channels, " but input is ",
                                                   ShapeString(in), " (", in[0], " channels)"));
  }
  const int64_t h = in[1] + 2 * c.PaddingH(), w = in[2] + 2 * c.PaddingW();
  if (c.KernelH() > h || c.KernelW() > w) {
    return absl::InvalidArgumentError(
        absl::StrCat(DescribeKernel(c), " is larger than the padded input ", h, "x", w));
  }
  return Shape{c.out_channels, (h - c.KernelH()) / c.StrideH() + 1,
               (w - c.KernelW()) / c.StrideW() + 1};
}

int64_t ParameterCount(const Conv2dConfig& c) {
  return c.out_channels * c.in_channels * c.KernelH() * c.KernelW() + (c.bias ? c.out_channels : 0);
}

absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const Conv2dConfig& c, const LayerContext& ctx) {
  return Conv2d::Create(c, ctx.backend, ctx.input, ctx.output, ctx.rng, ctx.fused,
                        ctx.fused_max_pool, ctx.input_layout, ctx.output_layout);
}

absl::StatusOr<std::unique_ptr<Layer>> Conv2d::Create(const Conv2dConfig& config, Backend* backend,
                                                      const Shape& input, const Shape& output,
                                                      Rng* rng, Activation act, int64_t max_pool,
                                                      ImageLayout x_layout, ImageLayout y_layout) {
  auto layer = std::unique_ptr<Conv2d>(new Conv2d(config, backend, input, output, act, max_pool));
  layer->x_layout_ = x_layout;
  layer->y_layout_ = y_layout;
  const int64_t kh = config.KernelH(), kw = config.KernelW();
  const float bound = 1.0f / std::sqrt(static_cast<float>(config.in_channels * kh * kw));
  KILN_RETURN_IF_ERROR(InitUniformParameter(backend, "weight",
                                            {config.out_channels, config.in_channels, kh, kw},
                                            bound, rng, &layer->weight_));
  if (config.bias) {
    KILN_RETURN_IF_ERROR(
        InitUniformParameter(backend, "bias", {config.out_channels}, bound, rng, &layer->bias_));
  }
  return std::unique_ptr<Layer>(std::move(layer));
}

std::vector<Parameter*> Conv2d::parameters() {
  if (config_.bias) return {&weight_, &bias_};
  return {&weight_};
}

Conv2dGeometry MakeConv2dGeometry(const Conv2dConfig& c, const Shape& input, int64_t batch) {
  Conv2dGeometry g;
  g.batch = static_cast<int>(std::min<int64_t>(batch, std::numeric_limits<int>::max()));
  g.in_channels = static_cast<int>(input[0]);
  g.in_h = static_cast<int>(input[1]);
  g.in_w = static_cast<int>(input[2]);
  g.out_channels = static_cast<int>(c.out_channels);
  g.kernel_h = static_cast<int>(c.KernelH());
  g.kernel_w = static_cast<int>(c.KernelW());
  g.stride_h = static_cast<int>(c.StrideH());
  g.stride_w = static_cast<int>(c.StrideW());
  g.padding_h = static_cast<int>(c.PaddingH());
  g.padding_w = static_cast<int>(c.PaddingW());
  return g;
}

Conv2dGeometry Conv2d::Geometry(int64_t batch) const {
  Conv2dGeometry g = MakeConv2dGeometry(config_, input_shape_, batch);
  g.x_layout = x_layout_;
  g.y_layout = y_layout_;
  return g;
}

Pool2dGeometry Conv2d::PoolGeometry(int64_t batch) const {
  return MakePool2dGeometry(max_pool_, max_pool_, 0, output_shape_, batch);
}

absl::Status Conv2d::Forward(const Tensor& x, Tensor* y, Mode) {
  const float* bias = config_.bias ? bias_.value.f32() : nullptr;
  if (max_pool_ == 0) {
    return backend_->Conv2dForward(Geometry(x.dim(0)), x.f32(), weight_.value.f32(), bias, act_,
                                   y->f32());
  }
  // One byte per pooled value: the winners the backward scatters dy to.
  if (!winners_.Reshape(y->shape())) {
    KILN_ASSIGN_OR_RETURN(winners_, backend_->Allocate(DType::kU8, y->shape()));
  }
  return backend_->Conv2dMaxPoolForward(Geometry(x.dim(0)), PoolGeometry(x.dim(0)), x.f32(),
                                        weight_.value.f32(), bias, act_, winners_.u8(), y->f32());
}

absl::Status Conv2d::Backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) {
  if (max_pool_ != 0) {
    return backend_->Conv2dMaxPoolBackward(
        Geometry(x.dim(0)), PoolGeometry(x.dim(0)), x.f32(), weight_.value.f32(), winners_.u8(),
        dy.f32(), act_, weight_.grad.f32(), config_.bias ? bias_.grad.f32() : nullptr,
        dx ? dx->f32() : nullptr);
  }
  return backend_->Conv2dBackward(
      Geometry(x.dim(0)), x.f32(), weight_.value.f32(), y.f32(), dy.f32(), act_, weight_.grad.f32(),
      config_.bias ? bias_.grad.f32() : nullptr, dx ? dx->f32() : nullptr);
}

}  // namespace kiln
