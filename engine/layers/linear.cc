#include "engine/layers/linear.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/layers/layer_rules.h"
#include "engine/layers/parameter_init.h"

namespace kiln {

namespace {

std::string DescribeInput(const Shape& in) {
  if (in.size() == 1) return std::to_string(in[0]);
  return absl::StrCat(ShapeString(in), " = ", NumElements(in));
}

}  // namespace

absl::StatusOr<Shape> OutputShape(const LinearConfig& c, const Shape& in) {
  KILN_RETURN_IF_ERROR(CheckPositive("in_features", c.in_features));
  KILN_RETURN_IF_ERROR(CheckPositive("out_features", c.out_features));
  // The whole sample first, so every model that built before builds the same.
  if (NumElements(in) == c.in_features) return Shape{c.out_features};
  if (in.size() >= 2 && in.back() == c.in_features) {
    Shape out = in;
    out.back() = c.out_features;
    return out;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("in_features ", c.in_features, " but input is ", DescribeInput(in),
                   // A sequence's (T, d): say which d the positions have.
                   in.size() == 2 ? absl::StrCat(" (or per position ", in.back(), ")") : ""));
}

int64_t ParameterCount(const LinearConfig& c) {
  const int64_t weight = c.tie_weight.empty() ? c.in_features * c.out_features : 0;
  return weight + (c.bias ? c.out_features : 0);
}

absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const LinearConfig& c, const LayerContext& ctx) {
  return Linear::Create(c, ctx.backend, ctx.input, ctx.rng);
}

absl::StatusOr<std::unique_ptr<Layer>> Linear::Create(const LinearConfig& config, Backend* backend,
                                                      const Shape& input, Rng* rng) {
  KILN_ASSIGN_OR_RETURN(Shape output, OutputShape(config, input));
  auto layer = std::unique_ptr<Linear>(new Linear(config, backend, input, std::move(output)));
  const float bound = 1.0f / std::sqrt(static_cast<float>(config.in_features));
  layer->weight_.name = "weight";
  if (config.tie_weight.empty()) {  // a tied weight is the model's to bind (Model::Build)
    KILN_RETURN_IF_ERROR(InitUniformParameter(
        backend, "weight", {config.out_features, config.in_features}, bound, rng, &layer->weight_));
  }
  if (config.bias) {
    KILN_RETURN_IF_ERROR(
        InitUniformParameter(backend, "bias", {config.out_features}, bound, rng, &layer->bias_));
  }
  return std::unique_ptr<Layer>(std::move(layer));
}

std::vector<Parameter*> Linear::parameters() {
  std::vector<Parameter*> out;
  if (tied_ == nullptr) out.push_back(&weight_);
  if (config_.bias) out.push_back(&bias_);
  return out;
}

absl::Status Linear::Forward(const Tensor& x, Tensor* y, Mode) {
  if (weight().value.numel() == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("linear: weight tied to ", config_.tie_weight, " was never bound"));
  }
  // x (rows, in), y (rows, out) = x W^T + b; rows = B, or B * T over a sequence's positions.
  const int batch = static_cast<int>(x.numel() / config_.in_features),
            in = static_cast<int>(config_.in_features),
            out = static_cast<int>(config_.out_features);
  KILN_RETURN_IF_ERROR(backend_->Gemm(Transpose::kNo, Transpose::kYes, batch, out, in, 1.0f,
                                      x.f32(), weight().value.f32(), 0.0f, y->f32()));
  if (config_.bias) {
    KILN_RETURN_IF_ERROR(backend_->BiasForward(batch, out, bias_.value.f32(), y->f32()));
  }
  return absl::OkStatus();
}

absl::Status Linear::Backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) {
  const int batch = static_cast<int>(x.numel() / config_.in_features),
            in = static_cast<int>(config_.in_features),
            out = static_cast<int>(config_.out_features);
  // dW (out, in) += dy^T (out, B) x (B, in)
  KILN_RETURN_IF_ERROR(backend_->Gemm(Transpose::kYes, Transpose::kNo, out, in, batch, 1.0f,
                                      dy.f32(), x.f32(), 1.0f, weight().grad.f32()));
  if (config_.bias) {
    KILN_RETURN_IF_ERROR(backend_->BiasBackward(batch, out, dy.f32(), bias_.grad.f32()));
  }
  if (dx != nullptr) {
    // dx (B, in) = dy (B, out) W (out, in)
    KILN_RETURN_IF_ERROR(backend_->Gemm(Transpose::kNo, Transpose::kNo, batch, in, out, 1.0f,
                                        dy.f32(), weight().value.f32(), 0.0f, dx->f32()));
  }
  return absl::OkStatus();
}

}  // namespace kiln
