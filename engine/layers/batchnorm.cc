#include "engine/layers/batchnorm.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/layers/layer_rules.h"

namespace kiln {

namespace {

absl::Status CheckFields(const BatchNormFields& c) {
  KILN_RETURN_IF_ERROR(CheckPositive("num_features", c.num_features));
  if (!(c.eps > 0)) return absl::InvalidArgumentError(absl::StrCat("eps must be > 0, got ", c.eps));
  if (!(c.momentum >= 0 && c.momentum <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("momentum must be in [0, 1], got ", c.momentum));
  }
  return absl::OkStatus();
}

absl::Status CheckChannels(const BatchNormFields& c, const Shape& in) {
  if (in[0] == c.num_features) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("num_features ", c.num_features, " but input is ",
                                                 ShapeString(in), " (", in[0], " channels)"));
}

absl::Status Fill(Backend* backend, const Shape& shape, float value, Tensor* t) {
  KILN_ASSIGN_OR_RETURN(*t, backend->Allocate(DType::kF32, shape));
  return value == 0.0f ? absl::OkStatus() : backend->Fill(t, value);
}

}  // namespace

absl::StatusOr<Shape> OutputShape(const BatchNorm2dConfig& c, const Shape& in) {
  KILN_RETURN_IF_ERROR(CheckFields(c));
  KILN_RETURN_IF_ERROR(CheckImageInput("batchnorm2d", in));
  KILN_RETURN_IF_ERROR(CheckChannels(c, in));
  return in;
}

absl::StatusOr<Shape> OutputShape(const BatchNorm1dConfig& c, const Shape& in) {
  KILN_RETURN_IF_ERROR(CheckFields(c));
  if (in.size() != 1 && in.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("needs an F or CxL input but input is ", ShapeString(in),
                     in.size() == 3 ? " (use batchnorm2d for CxHxW)" : ""));
  }
  KILN_RETURN_IF_ERROR(CheckChannels(c, in));
  return in;
}

absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const BatchNorm2dConfig& c,
                                                 const LayerContext& ctx) {
  return BatchNorm::Create("batchnorm2d", c, ctx.backend, ctx.input, ctx.input_layout, ctx.fused);
}

absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const BatchNorm1dConfig& c,
                                                 const LayerContext& ctx) {
  return BatchNorm::Create("batchnorm1d", c, ctx.backend, ctx.input);
}

absl::StatusOr<std::unique_ptr<Layer>> BatchNorm::Create(const char* type, const BatchNormFields& c,
                                                         Backend* backend, const Shape& shape,
                                                         ImageLayout layout, Activation act) {
  auto layer = std::unique_ptr<BatchNorm>(new BatchNorm(type, c, backend, shape));
  layer->layout_ = layout;
  layer->act_ = act;
  const Shape channels = {c.num_features};
  if (c.affine) {
    layer->weight_.name = "weight";
    layer->bias_.name = "bias";
    KILN_RETURN_IF_ERROR(Fill(backend, channels, 1.0f, &layer->weight_.value));
    KILN_RETURN_IF_ERROR(Fill(backend, channels, 0.0f, &layer->weight_.grad));
    KILN_RETURN_IF_ERROR(Fill(backend, channels, 0.0f, &layer->bias_.value));
    KILN_RETURN_IF_ERROR(Fill(backend, channels, 0.0f, &layer->bias_.grad));
  } else {
    KILN_RETURN_IF_ERROR(Fill(backend, channels, 1.0f, &layer->fixed_gamma_));
    KILN_RETURN_IF_ERROR(Fill(backend, channels, 0.0f, &layer->fixed_beta_));
    KILN_RETURN_IF_ERROR(Fill(backend, {2, c.num_features}, 0.0f, &layer->unused_grads_));
  }
  layer->running_mean_.name = "running_mean";
  layer->running_var_.name = "running_var";
  layer->num_batches_tracked_.name = "num_batches_tracked";
  layer->num_batches_tracked_.kind = BufferKind::kI64Count;
  KILN_RETURN_IF_ERROR(Fill(backend, channels, 0.0f, &layer->running_mean_.value));
  KILN_RETURN_IF_ERROR(Fill(backend, channels, 1.0f, &layer->running_var_.value));
  KILN_RETURN_IF_ERROR(Fill(backend, channels, 0.0f, &layer->saved_mean_));
  KILN_RETURN_IF_ERROR(Fill(backend, channels, 0.0f, &layer->saved_invstd_));
  return std::unique_ptr<Layer>(std::move(layer));
}

std::vector<Parameter*> BatchNorm::parameters() {
  if (config_.affine) return {&weight_, &bias_};
  return {};
}

std::vector<StateBuffer*> BatchNorm::buffers() {
  return {&running_mean_, &running_var_, &num_batches_tracked_};
}

std::string BatchNorm::Where() const {
  return absl::StrCat(type_, "(num_features=", config_.num_features, "): ");
}

BatchNormGeometry BatchNorm::Geometry(const Tensor& x) const {
  BatchNormGeometry g;
  g.batch = static_cast<int>(x.dim(0));
  g.channels = static_cast<int>(config_.num_features);
  g.spatial = NumElements(input_shape_) / config_.num_features;
  g.layout = layout_;
  return g;
}

absl::Status BatchNorm::Forward(const Tensor& x, Tensor* y, Mode mode) {
  const BatchNormGeometry g = Geometry(x);
  const float* gamma = config_.affine ? weight_.value.f32() : fixed_gamma_.f32();
  const float* beta = config_.affine ? bias_.value.f32() : fixed_beta_.f32();
  absl::Status s;
  // With a fused ReLU, the batch norm's ops that apply it.
  auto inference = act_ == Activation::kRelu ? &Backend::BatchNormReluForwardInference
                                             : &Backend::BatchNormForwardInference;
  auto training = act_ == Activation::kRelu ? &Backend::BatchNormReluForwardTraining
                                            : &Backend::BatchNormForwardTraining;
  if (mode == Mode::kEval) {
    s = (backend_->*inference)(g, config_.eps, x.f32(), gamma, beta, running_mean_.value.f32(),
                               running_var_.value.f32(), y->f32());
  } else {
    s = (backend_->*training)(g, config_.eps, config_.momentum, x.f32(), gamma, beta, y->f32(),
                              running_mean_.value.f32(), running_var_.value.f32(),
                              saved_mean_.f32(), saved_invstd_.f32());
    if (s.ok()) ++num_batches_tracked_.count;
  }
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(Where(), s.message()));
  return absl::OkStatus();
}

absl::Status BatchNorm::Backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) {
  const float* gamma = config_.affine ? weight_.value.f32() : fixed_gamma_.f32();
  float* dgamma = config_.affine ? weight_.grad.f32() : unused_grads_.f32();
  float* dbeta = config_.affine ? bias_.grad.f32() : unused_grads_.f32() + config_.num_features;
  float* dx_or_null = dx != nullptr ? dx->f32() : nullptr;
  absl::Status s =
      act_ == Activation::kRelu
          ? backend_->BatchNormReluBackward(Geometry(x), config_.eps, x.f32(), gamma,
                                            saved_mean_.f32(), saved_invstd_.f32(), y.f32(),
                                            dy.f32(), dgamma, dbeta, dx_or_null)
          : backend_->BatchNormBackward(Geometry(x), config_.eps, x.f32(), gamma, saved_mean_.f32(),
                                        saved_invstd_.f32(), dy.f32(), dgamma, dbeta, dx_or_null);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(Where(), s.message()));
  return absl::OkStatus();
}

}  // namespace kiln
