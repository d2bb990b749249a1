#include "engine/layers/layernorm.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/layers/layer_rules.h"

namespace kiln {

namespace {

absl::Status Init(Backend* backend, const char* name, int64_t size, float value, Parameter* p) {
  p->name = name;
  KILN_ASSIGN_OR_RETURN(p->value, backend->Allocate(DType::kF32, {size}));
  KILN_ASSIGN_OR_RETURN(p->grad, backend->Allocate(DType::kF32, {size}));
  return value == 0.0f ? absl::OkStatus() : backend->Fill(&p->value, value);
}

}  // namespace

absl::StatusOr<Shape> OutputShape(const LayerNormConfig& c, const Shape& in) {
  KILN_RETURN_IF_ERROR(CheckPositive("normalized_shape", c.normalized_shape));
  if (!(c.eps > 0)) return absl::InvalidArgumentError(absl::StrCat("eps must be > 0, got ", c.eps));
  if (in.empty() || in.back() != c.normalized_shape) {
    return absl::InvalidArgumentError(
        absl::StrCat("normalized_shape ", c.normalized_shape, " but the input's last dimension is ",
                     in.empty() ? 0 : in.back(), " (input ", ShapeString(in), ")"));
  }
  return in;
}

int64_t ParameterCount(const LayerNormConfig& c) {
  if (!c.affine) return 0;
  return c.bias ? 2 * c.normalized_shape : c.normalized_shape;
}

absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const LayerNormConfig& c,
                                                 const LayerContext& ctx) {
  return LayerNorm::Create(c, ctx.backend, ctx.input);
}

absl::StatusOr<std::unique_ptr<Layer>> LayerNorm::Create(const LayerNormConfig& c, Backend* backend,
                                                         const Shape& shape) {
  KILN_RETURN_IF_ERROR(OutputShape(c, shape).status());
  auto layer = std::unique_ptr<LayerNorm>(new LayerNorm(c, backend, shape));
  if (c.affine) {
    KILN_RETURN_IF_ERROR(Init(backend, "weight", c.normalized_shape, 1.0f, &layer->weight_));
    if (c.bias) {
      KILN_RETURN_IF_ERROR(Init(backend, "bias", c.normalized_shape, 0.0f, &layer->bias_));
    }
  }
  return std::unique_ptr<Layer>(std::move(layer));
}

std::vector<Parameter*> LayerNorm::parameters() {
  if (!config_.affine) return {};
  if (!config_.bias) return {&weight_};
  return {&weight_, &bias_};
}

absl::Status LayerNorm::Forward(const Tensor& x, Tensor* y, Mode) {
  const int64_t rows = Rows(x);
  if (!mean_.Reshape({rows})) {
    KILN_ASSIGN_OR_RETURN(mean_, backend_->Allocate(DType::kF32, {rows}));
    KILN_ASSIGN_OR_RETURN(rstd_, backend_->Allocate(DType::kF32, {rows}));
  }
  rstd_.Reshape({rows});
  const float* gamma = config_.affine ? weight_.value.f32() : nullptr;
  const float* beta = config_.affine && config_.bias ? bias_.value.f32() : nullptr;
  return backend_->LayerNormForward(rows, static_cast<int>(config_.normalized_shape),
                                    static_cast<float>(config_.eps), x.f32(), gamma, beta, y->f32(),
                                    mean_.f32(), rstd_.f32());
}

absl::Status LayerNorm::Backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) {
  const float* gamma = config_.affine ? weight_.value.f32() : nullptr;
  float* dgamma = config_.affine ? weight_.grad.f32() : nullptr;
  float* dbeta = config_.affine && config_.bias ? bias_.grad.f32() : nullptr;
  return backend_->LayerNormBackward(Rows(x), static_cast<int>(config_.normalized_shape), x.f32(),
                                     gamma, mean_.f32(), rstd_.f32(), dy.f32(),
                                     dx != nullptr ? dx->f32() : nullptr, dgamma, dbeta);
}

}  // namespace kiln
