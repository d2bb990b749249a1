#include "server/jobs/spec_translation.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "engine/data/augment.h"
#include "engine/model/model.h"
#include "engine/model/model_graph.h"
#include "engine/reference_configs.h"
#include "engine/model/sequence_model.h"
#include "server/jobs/job_labels.h"

namespace kiln::server {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

// Checks lo <= value <= hi; NaN fails too.
template <typename T>
absl::Status InRange(absl::string_view field, T value, T lo, T hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return Invalid(field, absl::StrCat("must be in [", lo, ", ", hi, "], got ", value));
}

absl::Status Fraction(absl::string_view field, float value) {
  if (value >= 0 && value < 1) return absl::OkStatus();
  return Invalid(field, absl::StrCat("must be in [0, 1), got ", value));
}

// A BatchNorm2dLayer or BatchNorm1dLayer (the same fields) under `field` ("spec.model.layers[2]
// .batchnorm2d"), defaults filled in as PyTorch's.
template <typename Message>
absl::Status TranslateBatchNorm(const Message& l, const std::string& field, int64_t max,
                                BatchNormFields* c) {
  c->num_features = l.num_features();
  if (l.has_eps()) c->eps = l.eps();
  if (l.has_momentum()) c->momentum = l.momentum();
  c->affine = !l.has_affine() || l.affine();
  KILN_RETURN_IF_ERROR(InRange(field + ".num_features", c->num_features, int64_t{1}, max));
  if (!(c->eps > 0 && c->eps <= 1)) {
    return Invalid(field + ".eps", absl::StrCat("must be in (0, 1], got ", c->eps));
  }
  return InRange(field + ".momentum", c->momentum, 0.0, 1.0);
}

// Without a preset or spec.normalization: pixels scaled to [0, 1].
PixelNorm DefaultNorm() { return PixelNorm{1.0f / 255.0f, 0.0f, 1.0f}; }

struct Preset {
  ModelConfig model;
  OptimizerConfig optimizer;
  int batch_size;
  PixelNorm norm;
};

absl::StatusOr<Preset> FindPreset(const std::string& name) {
  auto preset = [](const TrainConfig& c) {
    return Preset{c.model, c.optimizer, c.batch_size, c.norm};
  };
  if (name == "mnist-mlp") return preset(MnistMlpReference());
  if (name == "mnist-cnn") return preset(MnistCnnReference());
  return Invalid("spec.preset", absl::StrCat("unknown preset \"", name, "\"; expected one of ",
                                             absl::StrJoin(kPresetNames, ", ")));
}

// The optimizer as a spec would write it: PyTorch's defaults (betas, eps) left unset.
v1::OptimizerSpec OptimizerSpecOf(const OptimizerConfig& c) {
  v1::OptimizerSpec spec;
  switch (c.kind) {
    case OptimizerConfig::Kind::kSgd:
      spec.set_kind(v1::OptimizerSpec::KIND_SGD);
      break;
    case OptimizerConfig::Kind::kAdam:
      spec.set_kind(v1::OptimizerSpec::KIND_ADAM);
      break;
    case OptimizerConfig::Kind::kAdamW:
      spec.set_kind(v1::OptimizerSpec::KIND_ADAMW);
      break;
  }
  spec.set_lr(c.lr);
  spec.set_weight_decay(c.weight_decay);
  spec.set_momentum(c.momentum);
  spec.set_dampening(c.dampening);
  spec.set_nesterov(c.nesterov);
  const OptimizerConfig defaults;
  if (c.beta1 != defaults.beta1) spec.set_beta1(c.beta1);
  if (c.beta2 != defaults.beta2) spec.set_beta2(c.beta2);
  if (c.eps != defaults.eps) spec.set_eps(c.eps);
  if (c.decay_rule == OptimizerConfig::DecayRule::kMatrices) {
    spec.set_weight_decay_rule(v1::OptimizerSpec::WEIGHT_DECAY_RULE_MATRICES);
  }
  return spec;
}

v1::PixelNormSpec NormSpecOf(const PixelNorm& n) {
  v1::PixelNormSpec spec;
  spec.set_scale(n.scale);
  if (n.channel_mean.empty()) {
    spec.set_mean(n.mean);
    spec.set_std(n.std);
  }
  spec.mutable_channel_mean()->Add(n.channel_mean.begin(), n.channel_mean.end());
  spec.mutable_channel_std()->Add(n.channel_std.begin(), n.channel_std.end());
  return spec;
}

// A Conv2dLayer under `field`, defaults filled in as PyTorch's, each axis's form checked.
absl::StatusOr<LayerConfig> TranslateConv2d(const v1::Layer& layer, const std::string& field,
                                            int64_t max) {
  const v1::Conv2dLayer& l = layer.conv2d();
  Conv2dConfig c;
  c.in_channels = l.in_channels();
  c.out_channels = l.out_channels();
  c.kernel_size = l.kernel_size() == 0 ? 3 : l.kernel_size();
  c.stride = l.stride() == 0 ? 1 : l.stride();
  c.padding = l.padding();
  c.bias = !l.has_bias() || l.bias();
  KILN_RETURN_IF_ERROR(InRange(field + ".conv2d.in_channels", c.in_channels, int64_t{1}, max));
  KILN_RETURN_IF_ERROR(InRange(field + ".conv2d.out_channels", c.out_channels, int64_t{1}, max));
  KILN_RETURN_IF_ERROR(
      InRange(field + ".conv2d.kernel_size", c.kernel_size, int64_t{1}, int64_t{64}));
  KILN_RETURN_IF_ERROR(InRange(field + ".conv2d.stride", c.stride, int64_t{1}, int64_t{64}));
  // The per-axis forms: the square fields' bounds, per axis.
  if (l.has_kernel_h()) c.kernel_h = l.kernel_h();
  if (l.has_kernel_w()) c.kernel_w = l.kernel_w();
  if (l.has_stride_h()) c.stride_h = l.stride_h();
  if (l.has_stride_w()) c.stride_w = l.stride_w();
  if (l.has_padding_h()) c.padding_h = l.padding_h();
  if (l.has_padding_w()) c.padding_w = l.padding_w();
  KILN_RETURN_IF_ERROR(InRange(field + ".conv2d.kernel_h", c.KernelH(), int64_t{1}, int64_t{64}));
  KILN_RETURN_IF_ERROR(InRange(field + ".conv2d.kernel_w", c.KernelW(), int64_t{1}, int64_t{64}));
  KILN_RETURN_IF_ERROR(InRange(field + ".conv2d.stride_h", c.StrideH(), int64_t{1}, int64_t{64}));
  KILN_RETURN_IF_ERROR(InRange(field + ".conv2d.stride_w", c.StrideW(), int64_t{1}, int64_t{64}));
  // Padding is checked against each axis's kernel, named as the spec gave it.
  KILN_RETURN_IF_ERROR(
      InRange(field + (l.has_padding_h() ? ".conv2d.padding_h" : ".conv2d.padding"), c.PaddingH(),
              int64_t{0}, c.KernelH() - 1));
  KILN_RETURN_IF_ERROR(
      InRange(field + (l.has_padding_w() ? ".conv2d.padding_w" : ".conv2d.padding"), c.PaddingW(),
              int64_t{0}, c.KernelW() - 1));
  return c;
}

// The layers of a transformer (issue 36), each checked against the same per-dimension bound.
absl::StatusOr<LayerConfig> TranslateSequenceLayer(const v1::Layer& layer, const std::string& field,
                                                   const SpecLimits& limits) {
  const int64_t max = limits.max_features;
  auto dim = [&](const std::string& name, int64_t v) {
    return InRange(field + name, v, int64_t{1}, max);
  };
  switch (layer.kind_case()) {
    case v1::Layer::kEmbedding: {
      const v1::EmbeddingLayer& l = layer.embedding();
      KILN_RETURN_IF_ERROR(dim(".embedding.num_embeddings", l.num_embeddings()));
      KILN_RETURN_IF_ERROR(dim(".embedding.embedding_dim", l.embedding_dim()));
      return EmbeddingConfig{l.num_embeddings(), l.embedding_dim()};
    }
    case v1::Layer::kPositionEmbedding: {
      const v1::PositionEmbeddingLayer& l = layer.position_embedding();
      KILN_RETURN_IF_ERROR(dim(".position_embedding.block_size", l.block_size()));
      KILN_RETURN_IF_ERROR(dim(".position_embedding.embedding_dim", l.embedding_dim()));
      return PositionEmbeddingConfig{l.block_size(), l.embedding_dim()};
    }
    case v1::Layer::kLayernorm: {
      const v1::LayerNormLayer& l = layer.layernorm();
      LayerNormConfig c;
      c.normalized_shape = l.normalized_shape();
      if (l.has_eps()) c.eps = l.eps();
      c.affine = !l.has_affine() || l.affine();
      c.bias = !l.has_bias() || l.bias();
      KILN_RETURN_IF_ERROR(dim(".layernorm.normalized_shape", c.normalized_shape));
      if (!(c.eps > 0 && c.eps <= 1)) {
        return Invalid(field + ".layernorm.eps", absl::StrCat("must be in (0, 1], got ", c.eps));
      }
      return c;
    }
    case v1::Layer::kCausalSelfAttention: {
      const v1::CausalSelfAttentionLayer& l = layer.causal_self_attention();
      CausalSelfAttentionConfig c;
      c.n_head = l.n_head();
      c.n_embd = l.n_embd();
      c.bias = !l.has_bias() || l.bias();
      c.dropout = l.dropout();
      KILN_RETURN_IF_ERROR(dim(".causal_self_attention.n_embd", c.n_embd));
      KILN_RETURN_IF_ERROR(
          InRange(field + ".causal_self_attention.n_head", c.n_head, int64_t{1}, c.n_embd));
      if (c.n_embd % c.n_head != 0) {
        return Invalid(field + ".causal_self_attention.n_head",
                       absl::StrCat(c.n_head, " heads do not divide n_embd ", c.n_embd));
      }
      KILN_RETURN_IF_ERROR(Fraction(field + ".causal_self_attention.dropout", c.dropout));
      return c;
    }
    default:
      return Invalid(field, "not a sequence layer");
  }
}

absl::StatusOr<LayerConfig> TranslateLayer(const v1::Layer& layer, const std::string& field,
                                           const SpecLimits& limits) {
  const int64_t max = limits.max_features;
  switch (layer.kind_case()) {
    case v1::Layer::kLinear: {
      const v1::LinearLayer& l = layer.linear();
      KILN_RETURN_IF_ERROR(
          InRange(field + ".linear.in_features", l.in_features(), int64_t{1}, max));
      KILN_RETURN_IF_ERROR(
          InRange(field + ".linear.out_features", l.out_features(), int64_t{1}, max));
      // tie_weight's target is checked with the graph (InferShapes), which knows the nodes.
      return LinearConfig{l.in_features(), l.out_features(), !l.has_bias() || l.bias(),
                          l.tie_weight()};
    }
    case v1::Layer::kConv2D:
      return TranslateConv2d(layer, field, max);
    case v1::Layer::kRelu:
      return ReluConfig{};
    case v1::Layer::kMaxpool2D: {
      const v1::MaxPool2dLayer& l = layer.maxpool2d();
      MaxPool2dConfig c;
      c.kernel_size = l.kernel_size() == 0 ? 2 : l.kernel_size();
      c.stride = l.stride();
      KILN_RETURN_IF_ERROR(
          InRange(field + ".maxpool2d.kernel_size", c.kernel_size, int64_t{1}, int64_t{64}));
      KILN_RETURN_IF_ERROR(InRange(field + ".maxpool2d.stride", c.stride, int64_t{0}, int64_t{64}));
      c.padding = l.padding();
      KILN_RETURN_IF_ERROR(
          InRange(field + ".maxpool2d.padding", c.padding, int64_t{0}, c.kernel_size / 2));
      return c;
    }
    case v1::Layer::kAvgpool2D: {
      const v1::AvgPool2dLayer& l = layer.avgpool2d();
      AvgPool2dConfig c;
      c.kernel_size = l.kernel_size() == 0 ? 2 : l.kernel_size();
      c.stride = l.stride();
      c.padding = l.padding();
      KILN_RETURN_IF_ERROR(
          InRange(field + ".avgpool2d.kernel_size", c.kernel_size, int64_t{1}, int64_t{64}));
      KILN_RETURN_IF_ERROR(InRange(field + ".avgpool2d.stride", c.stride, int64_t{0}, int64_t{64}));
      KILN_RETURN_IF_ERROR(
          InRange(field + ".avgpool2d.padding", c.padding, int64_t{0}, c.kernel_size / 2));
      return c;
    }
    case v1::Layer::kAdaptiveAvgpool2D: {
      const v1::AdaptiveAvgPool2dLayer& l = layer.adaptive_avgpool2d();
      AdaptiveAvgPool2dConfig c;
      c.output_h = l.output_h() == 0 ? 1 : l.output_h();
      c.output_w = l.output_w() == 0 ? 1 : l.output_w();
      KILN_RETURN_IF_ERROR(
          InRange(field + ".adaptive_avgpool2d.output_h", c.output_h, int64_t{1}, max));
      KILN_RETURN_IF_ERROR(
          InRange(field + ".adaptive_avgpool2d.output_w", c.output_w, int64_t{1}, max));
      return c;
    }
    case v1::Layer::kTanh:
      return TanhConfig{};
    case v1::Layer::kSigmoid:
      return SigmoidConfig{};
    case v1::Layer::kGelu:
      return GeluConfig{};
    case v1::Layer::kLeakyRelu: {
      LeakyReluConfig c;
      if (layer.leaky_relu().has_negative_slope())
        c.negative_slope = layer.leaky_relu().negative_slope();
      if (!std::isfinite(c.negative_slope)) {
        return Invalid(field + ".leaky_relu.negative_slope",
                       absl::StrCat("must be finite, got ", c.negative_slope));
      }
      return c;
    }
    case v1::Layer::kSilu:
      return SiluConfig{};
    case v1::Layer::kFlatten:
      return FlattenConfig{};
    case v1::Layer::kDropout: {
      DropoutConfig c;
      if (layer.dropout().has_p()) c.p = layer.dropout().p();
      KILN_RETURN_IF_ERROR(Fraction(field + ".dropout.p", c.p));
      return c;
    }
    case v1::Layer::kSoftmax:
      return SoftmaxConfig{};
    case v1::Layer::kBatchnorm2D: {
      BatchNorm2dConfig c;
      KILN_RETURN_IF_ERROR(
          TranslateBatchNorm(layer.batchnorm2d(), field + ".batchnorm2d", max, &c));
      return c;
    }
    case v1::Layer::kBatchnorm1D: {
      BatchNorm1dConfig c;
      KILN_RETURN_IF_ERROR(
          TranslateBatchNorm(layer.batchnorm1d(), field + ".batchnorm1d", max, &c));
      return c;
    }
    case v1::Layer::kAdd:
      return AddConfig{};
    case v1::Layer::kConcat:
      return ConcatConfig{};
    case v1::Layer::kEmbedding:
    case v1::Layer::kPositionEmbedding:
    case v1::Layer::kLayernorm:
    case v1::Layer::kCausalSelfAttention:
      return TranslateSequenceLayer(layer, field, limits);
    case v1::Layer::KIND_NOT_SET:
      break;
  }
  return Invalid(
      field,
      "no layer type set (linear, conv2d, relu, maxpool2d, avgpool2d, batchnorm2d, add, ...)");
}

absl::StatusOr<ModelConfig> TranslateModel(const v1::ModelSpec& spec, const SpecLimits& limits) {
  if (spec.layers_size() > limits.max_layers) {
    return absl::ResourceExhaustedError(absl::StrCat("spec.model.layers: ", spec.layers_size(),
                                                     " layers exceed the limit of ",
                                                     limits.max_layers, " (--max_layers)"));
  }
  ModelConfig config;
  if (spec.input_shape_size() < 1 || spec.input_shape_size() > 4) {
    return Invalid("spec.model.input_shape",
                   absl::StrCat("needs 1 to 4 dimensions, got ", spec.input_shape_size()));
  }
  for (int i = 0; i < spec.input_shape_size(); ++i) {
    KILN_RETURN_IF_ERROR(InRange(absl::StrCat("spec.model.input_shape[", i, "]"),
                                 spec.input_shape(i), int64_t{1}, limits.max_features));
    config.input_shape.push_back(spec.input_shape(i));
  }
  // Bounds every later shape product: no layer multiplies the elements of a sample by more than
  // its channels times its kernel, each bounded too.
  double sample_elements = 1;  // in double: four dimensions of a million overflow int64
  for (int64_t d : config.input_shape) sample_elements *= static_cast<double>(d);
  if (sample_elements > static_cast<double>(limits.max_features)) {
    return Invalid("spec.model.input_shape",
                   absl::StrCat(ShapeString(config.input_shape), " is ", sample_elements,
                                " elements per sample, over the limit of ", limits.max_features));
  }
  switch (spec.init()) {
    case v1::INIT_RULE_DEFAULT:
      config.init = InitRule::kDefault;
      break;
    case v1::INIT_RULE_GPT2:
      config.init = InitRule::kGpt2;
      break;
    default:
      return Invalid("spec.model.init", absl::StrCat("unknown rule ", spec.init()));
  }
  for (int i = 0; i < spec.layers_size(); ++i) {
    const v1::Layer& l = spec.layers(i);
    const std::string field = absl::StrCat("spec.model.layers[", i, "]");
    KILN_ASSIGN_OR_RETURN(LayerConfig layer, TranslateLayer(l, field, limits));
    config.layers.push_back(layer);
    // The graph's rules (names, references, unused nodes) are the engine's: InferShapes checks
    // them below with the shapes. Here only what bounds the work of checking.
    if (l.inputs_size() > kMaxNodeInputs) {
      return Invalid(field + ".inputs",
                     absl::StrCat(l.inputs_size(), " inputs; at most ", kMaxNodeInputs));
    }
    if (!l.name().empty()) {
      config.names.resize(i + 1);
      config.names[i] = l.name();
    }
    if (l.inputs_size() > 0) {
      config.inputs.resize(i + 1);
      config.inputs[i].assign(l.inputs().begin(), l.inputs().end());
    }
  }
  return config;
}

absl::StatusOr<OptimizerConfig> TranslateOptimizer(const v1::OptimizerSpec& spec) {
  OptimizerConfig c;
  switch (spec.kind()) {
    case v1::OptimizerSpec::KIND_SGD:
      c.kind = OptimizerConfig::Kind::kSgd;
      break;
    case v1::OptimizerSpec::KIND_ADAM:
      c.kind = OptimizerConfig::Kind::kAdam;
      break;
    case v1::OptimizerSpec::KIND_ADAMW:
      c.kind = OptimizerConfig::Kind::kAdamW;
      break;
    default:
      return Invalid("spec.optimizer.kind", "required (KIND_SGD, KIND_ADAM or KIND_ADAMW)");
  }
  c.lr = spec.lr();
  if (!(c.lr > 0 && c.lr <= 10)) {
    return Invalid("spec.optimizer.lr", absl::StrCat("must be in (0, 10], got ", c.lr));
  }
  c.weight_decay = spec.weight_decay();
  KILN_RETURN_IF_ERROR(InRange("spec.optimizer.weight_decay", c.weight_decay, 0.0f, 1.0f));
  c.momentum = spec.momentum();
  KILN_RETURN_IF_ERROR(Fraction("spec.optimizer.momentum", c.momentum));
  c.dampening = spec.dampening();
  KILN_RETURN_IF_ERROR(InRange("spec.optimizer.dampening", c.dampening, 0.0f, 1.0f));
  c.nesterov = spec.nesterov();
  if (c.nesterov && (c.momentum <= 0 || c.dampening != 0)) {
    return Invalid("spec.optimizer.nesterov", "needs momentum > 0 and dampening 0");
  }
  if (spec.has_beta1()) c.beta1 = spec.beta1();
  if (spec.has_beta2()) c.beta2 = spec.beta2();
  if (spec.has_eps()) c.eps = spec.eps();
  KILN_RETURN_IF_ERROR(Fraction("spec.optimizer.beta1", c.beta1));
  KILN_RETURN_IF_ERROR(Fraction("spec.optimizer.beta2", c.beta2));
  if (!(c.eps > 0 && c.eps < 1)) {
    return Invalid("spec.optimizer.eps", absl::StrCat("must be in (0, 1), got ", c.eps));
  }
  switch (spec.weight_decay_rule()) {
    case v1::OptimizerSpec::WEIGHT_DECAY_RULE_ALL:
      c.decay_rule = OptimizerConfig::DecayRule::kAll;
      break;
    case v1::OptimizerSpec::WEIGHT_DECAY_RULE_MATRICES:
      c.decay_rule = OptimizerConfig::DecayRule::kMatrices;
      break;
    default:
      return Invalid("spec.optimizer.weight_decay_rule",
                     absl::StrCat("unknown rule ", spec.weight_decay_rule()));
  }
  return c;
}

absl::StatusOr<LrScheduleConfig> TranslateSchedule(const v1::ScheduleSpec& spec) {
  // Bounds warm-up and decay lengths (in steps) well past any run's.
  constexpr int64_t kMaxScheduleIters = 1'000'000'000;
  LrScheduleConfig c;
  switch (spec.kind()) {
    case v1::ScheduleSpec::KIND_CONSTANT:
      c.kind = LrScheduleConfig::Kind::kConstant;
      break;
    case v1::ScheduleSpec::KIND_STEP:
      c.kind = LrScheduleConfig::Kind::kStep;
      break;
    case v1::ScheduleSpec::KIND_COSINE:
      c.kind = LrScheduleConfig::Kind::kCosine;
      break;
    case v1::ScheduleSpec::KIND_ONE_CYCLE:
      c.kind = LrScheduleConfig::Kind::kOneCycle;
      break;
    case v1::ScheduleSpec::KIND_WARMUP_COSINE:
      c.kind = LrScheduleConfig::Kind::kWarmupCosine;
      break;
    default:
      return Invalid("spec.schedule.kind", absl::StrCat("unknown kind ", spec.kind()));
  }
  c.step_size = spec.step_size() == 0 ? 1 : spec.step_size();
  KILN_RETURN_IF_ERROR(
      InRange("spec.schedule.step_size", c.step_size, int64_t{1}, int64_t{1'000'000}));
  if (spec.has_gamma()) c.gamma = spec.gamma();
  if (!(c.gamma > 0 && c.gamma <= 1)) {
    return Invalid("spec.schedule.gamma", absl::StrCat("must be in (0, 1], got ", c.gamma));
  }
  c.t_max = spec.t_max();
  KILN_RETURN_IF_ERROR(InRange("spec.schedule.t_max", c.t_max, int64_t{0}, int64_t{1'000'000}));
  c.eta_min = spec.eta_min();
  KILN_RETURN_IF_ERROR(InRange("spec.schedule.eta_min", c.eta_min, 0.0f, 10.0f));
  if (spec.has_pct_start()) c.pct_start = spec.pct_start();
  if (!(c.pct_start > 0 && c.pct_start < 1)) {
    return Invalid("spec.schedule.pct_start", absl::StrCat("must be in (0, 1), got ", c.pct_start));
  }
  switch (spec.anneal()) {
    case v1::ScheduleSpec::ANNEAL_COS:
      c.anneal = LrScheduleConfig::Anneal::kCos;
      break;
    case v1::ScheduleSpec::ANNEAL_LINEAR:
      c.anneal = LrScheduleConfig::Anneal::kLinear;
      break;
    default:
      return Invalid("spec.schedule.anneal", absl::StrCat("unknown anneal ", spec.anneal()));
  }
  if (spec.has_div_factor()) c.div_factor = spec.div_factor();
  KILN_RETURN_IF_ERROR(InRange("spec.schedule.div_factor", c.div_factor, 1.0f, 1e6f));
  if (spec.has_final_div_factor()) c.final_div_factor = spec.final_div_factor();
  KILN_RETURN_IF_ERROR(InRange("spec.schedule.final_div_factor", c.final_div_factor, 1.0f, 1e9f));
  if (spec.has_cycle_momentum()) c.cycle_momentum = spec.cycle_momentum();
  if (spec.has_base_momentum()) c.base_momentum = spec.base_momentum();
  if (spec.has_max_momentum()) c.max_momentum = spec.max_momentum();
  KILN_RETURN_IF_ERROR(Fraction("spec.schedule.max_momentum", c.max_momentum));
  KILN_RETURN_IF_ERROR(
      InRange("spec.schedule.base_momentum", c.base_momentum, 0.0f, c.max_momentum));
  c.warmup_iters = spec.warmup_iters();
  KILN_RETURN_IF_ERROR(
      InRange("spec.schedule.warmup_iters", c.warmup_iters, int64_t{0}, kMaxScheduleIters));
  c.lr_decay_iters = spec.lr_decay_iters();
  KILN_RETURN_IF_ERROR(
      InRange("spec.schedule.lr_decay_iters", c.lr_decay_iters, int64_t{0}, kMaxScheduleIters));
  if (c.lr_decay_iters > 0 && c.lr_decay_iters < c.warmup_iters) {
    return Invalid("spec.schedule.lr_decay_iters",
                   absl::StrCat("must be 0 (the run's steps) or >= warmup_iters (", c.warmup_iters,
                                "), got ", c.lr_decay_iters));
  }
  return c;
}

absl::StatusOr<PixelNorm> TranslateNorm(const v1::PixelNormSpec& spec) {
  PixelNorm n{spec.scale(), spec.mean(), spec.std()};
  if (!std::isfinite(n.scale) || n.scale == 0) {
    return Invalid("spec.normalization.scale", "must be finite and non-zero");
  }
  if (spec.channel_mean_size() > 0 || spec.channel_std_size() > 0) {
    if (spec.channel_mean_size() != spec.channel_std_size()) {
      return Invalid("spec.normalization.channel_std",
                     absl::StrCat("has ", spec.channel_std_size(), " values but channel_mean has ",
                                  spec.channel_mean_size()));
    }
    if (spec.channel_mean_size() > kMaxNormChannels) {
      return Invalid(
          "spec.normalization.channel_mean",
          absl::StrCat("at most ", kMaxNormChannels, " channels, got ", spec.channel_mean_size()));
    }
    if (spec.mean() != 0 || spec.std() != 0) {
      return Invalid(
          "spec.normalization.mean",
          "mean and std are for one channel; leave them 0 with channel_mean/channel_std");
    }
    for (int i = 0; i < spec.channel_mean_size(); ++i) {
      if (!std::isfinite(spec.channel_mean(i))) {
        return Invalid(absl::StrCat("spec.normalization.channel_mean[", i, "]"), "must be finite");
      }
      if (!(spec.channel_std(i) > 0) || !std::isfinite(spec.channel_std(i))) {
        return Invalid(absl::StrCat("spec.normalization.channel_std[", i, "]"),
                       absl::StrCat("must be > 0, got ", spec.channel_std(i)));
      }
    }
    n.mean = 0.0f;
    n.std = 1.0f;
    n.channel_mean.assign(spec.channel_mean().begin(), spec.channel_mean().end());
    n.channel_std.assign(spec.channel_std().begin(), spec.channel_std().end());
    return n;
  }
  if (!std::isfinite(n.mean)) return Invalid("spec.normalization.mean", "must be finite");
  if (!(n.std > 0) || !std::isfinite(n.std)) {
    return Invalid("spec.normalization.std", absl::StrCat("must be > 0, got ", n.std));
  }
  return n;
}

// What a schedule asks of the optimizer it drives: momentum to cycle, a floor under the peak.
absl::Status CheckScheduleAgainstOptimizer(const LrScheduleConfig& schedule,
                                           const OptimizerConfig& optimizer) {
  if (schedule.kind == LrScheduleConfig::Kind::kOneCycle && schedule.cycle_momentum &&
      optimizer.kind == OptimizerConfig::Kind::kSgd && optimizer.momentum <= 0) {
    return Invalid("spec.schedule.cycle_momentum",
                   "cycles SGD's momentum, which needs spec.optimizer.momentum > 0 (or set "
                   "cycle_momentum false)");
  }
  if (schedule.kind == LrScheduleConfig::Kind::kWarmupCosine && schedule.eta_min > optimizer.lr) {
    return Invalid("spec.schedule.eta_min",
                   absl::StrCat("the warm-up cosine's floor (min_lr) ", schedule.eta_min,
                                " is above the peak, spec.optimizer.lr ", optimizer.lr));
  }
  return absl::OkStatus();
}

// Unset is fp32: TF32 and bfloat16 are asked for, never assumed.
absl::StatusOr<Precision> TranslatePrecision(v1::Precision precision) {
  switch (precision) {
    case v1::PRECISION_UNSPECIFIED:
    case v1::PRECISION_FP32:
      return Precision::kFp32;
    case v1::PRECISION_TF32:
      return Precision::kTf32;
    case v1::PRECISION_BF16:
      return Precision::kBf16;
    default:
      return Invalid("spec.precision",
                     absl::StrCat("unknown precision ", precision,
                                  " (PRECISION_FP32, PRECISION_TF32 or PRECISION_BF16)"));
  }
}

// How long the job runs: epochs of the dataset, or for a language model max_iters iterations
// in evaluation intervals (each an "epoch" of the run: the trainer's and kilnd's unit of events
// and checkpoints). Also the per-step options of both: accumulation and clipping.
absl::Status TranslateRunLength(const v1::JobSpec& spec, const SpecLimits& limits,
                                TrainConfig* config) {
  config->grad_clip = spec.grad_clip();
  KILN_RETURN_IF_ERROR(InRange("spec.grad_clip", config->grad_clip, 0.0f, 1e6f));
  if (spec.max_iters() == 0) {
    for (const auto& [field, set] :
         {std::pair{"spec.eval_interval", spec.eval_interval() != 0},
          {"spec.eval_iters", spec.eval_iters() != 0},
          {"spec.gradient_accumulation_steps", spec.gradient_accumulation_steps() > 1}}) {
      if (set) return Invalid(field, "applies to language models, with spec.max_iters");
    }
    KILN_RETURN_IF_ERROR(InRange("spec.epochs", spec.epochs(), 1, limits.max_epochs));
    config->epochs = spec.epochs();
    return absl::OkStatus();
  }
  KILN_RETURN_IF_ERROR(
      InRange("spec.max_iters", spec.max_iters(), int64_t{1}, int64_t{10'000'000}));
  if (spec.epochs() != 0) {
    return Invalid("spec.epochs",
                   "leave it 0 with spec.max_iters: a language model's run is "
                   "counted in iterations");
  }
  config->max_iters = spec.max_iters();
  config->eval_interval =
      spec.eval_interval() == 0 ? std::min<int64_t>(250, config->max_iters) : spec.eval_interval();
  KILN_RETURN_IF_ERROR(
      InRange("spec.eval_interval", config->eval_interval, int64_t{1}, config->max_iters));
  config->eval_iters = spec.eval_iters() == 0 ? 20 : spec.eval_iters();
  KILN_RETURN_IF_ERROR(InRange("spec.eval_iters", config->eval_iters, 1, 10'000));
  config->grad_accum =
      spec.gradient_accumulation_steps() == 0 ? 1 : spec.gradient_accumulation_steps();
  KILN_RETURN_IF_ERROR(InRange("spec.gradient_accumulation_steps", config->grad_accum, 1, 1024));
  const int64_t evaluations =
      (config->max_iters + config->eval_interval - 1) / config->eval_interval;
  if (evaluations > limits.max_epochs) {
    return Invalid(
        "spec.eval_interval",
        absl::StrCat("max_iters / eval_interval gives ", evaluations,
                     " evaluations, over the limit of ", limits.max_epochs, " (--max_epochs)"));
  }
  config->epochs = static_cast<int>(evaluations);
  return absl::OkStatus();
}

// The translated model's shapes, kind, normalisation and size against the limits, before
// anything is allocated.
absl::Status CheckModelFits(const TrainConfig& config, const SpecLimits& limits) {
  // Shapes through the whole model, before anything is allocated.
  absl::StatusOr<std::vector<Shape>> shapes = InferShapes(config.model);
  if (!shapes.ok()) return Invalid("spec.model", shapes.status().message());
  if (ReadsTokenIds(config.model)) {
    // The vocabulary is checked at Submit, against the dataset's.
    absl::Status sequence = SequenceModelShapeOf(config.model).status();
    if (!sequence.ok()) return Invalid("spec.model", sequence.message());
  } else if (shapes->back().size() != 1) {
    return Invalid("spec.model", absl::StrCat("the last layer must output a vector of class "
                                              "logits, got ",
                                              ShapeString(shapes->back())));
  }
  if (config.max_iters > 0 && !ReadsTokenIds(config.model)) {
    return Invalid("spec.max_iters",
                   "is for language models (an embedding reading token ids); set epochs instead");
  }
  if (config.norm.channels() > 1 && !config.model.input_shape.empty() &&
      config.model.input_shape[0] != config.norm.channels()) {
    return Invalid("spec.normalization.channel_mean",
                   absl::StrCat(config.norm.channels(), " channels but the model's input is ",
                                ShapeString(config.model.input_shape),
                                " (channels first, e.g. [3, 32, 32] for 3)"));
  }
  const int64_t parameters = CountParameters(config.model);
  if (parameters > limits.max_parameters) {
    return absl::ResourceExhaustedError(absl::StrCat("spec.model: ", parameters,
                                                     " parameters exceed the limit of ",
                                                     limits.max_parameters, " (--max_parameters)"));
  }
  const int64_t activation_bytes = ActivationBytes(*shapes, config.batch_size);
  if (activation_bytes > limits.max_activation_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("spec.model: a batch of ", config.batch_size, " needs ", activation_bytes,
                     " bytes of activations and gradients, over the limit of ",
                     limits.max_activation_bytes, " (--max_activation_bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::JobSpec> PresetRecipe(const std::string& name) {
  KILN_ASSIGN_OR_RETURN(Preset preset, FindPreset(name));
  v1::JobSpec recipe;
  *recipe.mutable_optimizer() = OptimizerSpecOf(preset.optimizer);
  recipe.set_batch_size(preset.batch_size);
  *recipe.mutable_normalization() = NormSpecOf(preset.norm);
  return recipe;
}

// The same precedence as TranslateSpec's: a field the spec sets wins, an optimizer whole.
v1::JobSpec ResolvedSpec(const v1::JobSpec& spec) {
  v1::JobSpec resolved = spec;
  v1::JobSpec recipe;
  *recipe.mutable_normalization() = NormSpecOf(DefaultNorm());
  if (!spec.preset().empty()) {
    absl::StatusOr<v1::JobSpec> preset = PresetRecipe(spec.preset());
    if (preset.ok()) recipe = *std::move(preset);
  }
  if (spec.optimizer().kind() == v1::OptimizerSpec::KIND_UNSPECIFIED && recipe.has_optimizer()) {
    *resolved.mutable_optimizer() = recipe.optimizer();
  }
  if (spec.batch_size() == 0) resolved.set_batch_size(recipe.batch_size());
  if (!spec.has_normalization()) *resolved.mutable_normalization() = recipe.normalization();
  if (spec.precision() == v1::PRECISION_UNSPECIFIED) resolved.set_precision(v1::PRECISION_FP32);
  return resolved;
}

absl::StatusOr<TrainConfig> TranslateSpec(const v1::JobSpec& spec, const SpecLimits& limits) {
  KILN_RETURN_IF_ERROR(ValidateNameAndLabels(spec));
  TrainConfig config;
  config.norm = DefaultNorm();
  bool have_model = false, have_optimizer = false;
  int batch_size = 0;
  if (!spec.preset().empty()) {
    KILN_ASSIGN_OR_RETURN(Preset preset, FindPreset(spec.preset()));
    config.model = preset.model;
    config.optimizer = preset.optimizer;
    config.norm = preset.norm;
    batch_size = preset.batch_size;
    have_model = have_optimizer = true;
  }
  if (spec.model().layers_size() > 0) {
    KILN_ASSIGN_OR_RETURN(config.model, TranslateModel(spec.model(), limits));
    have_model = true;
  } else if (spec.model().input_shape_size() > 0) {
    return Invalid("spec.model.layers", "required when spec.model.input_shape is set");
  }
  if (!have_model) return Invalid("spec.model", "required without a preset");
  if (spec.optimizer().kind() != v1::OptimizerSpec::KIND_UNSPECIFIED || !have_optimizer) {
    KILN_ASSIGN_OR_RETURN(config.optimizer, TranslateOptimizer(spec.optimizer()));
  } else if (spec.optimizer().ByteSizeLong() > 0) {
    // Fields set (proto3 writes only those) but no kind: they would be silently dropped.
    return Invalid("spec.optimizer.kind",
                   "required when the spec sets optimizer fields: a spec's optimizer replaces "
                   "the preset's whole (kiln get shows the preset's, to copy from)");
  }
  KILN_ASSIGN_OR_RETURN(config.schedule, TranslateSchedule(spec.schedule()));
  switch (spec.loss()) {
    case v1::LOSS_KIND_CROSS_ENTROPY:
      config.loss = LossKind::kCrossEntropy;
      break;
    case v1::LOSS_KIND_MEAN_SQUARED_ERROR:
      config.loss = LossKind::kMeanSquaredError;
      break;
    default:
      return Invalid("spec.loss", absl::StrCat("unknown loss ", spec.loss()));
  }
  config.label_smoothing = spec.label_smoothing();
  KILN_RETURN_IF_ERROR(InRange("spec.label_smoothing", config.label_smoothing, 0.0f, 1.0f));
  if (config.label_smoothing > 0 && config.loss != LossKind::kCrossEntropy) {
    return Invalid("spec.label_smoothing", "applies to LOSS_KIND_CROSS_ENTROPY only");
  }
  // Whether the dataset holds images the padding fits is checked at Submit, which knows it.
  config.augment.random_crop_padding = spec.augment().random_crop_padding();
  config.augment.horizontal_flip = spec.augment().horizontal_flip();
  KILN_RETURN_IF_ERROR(InRange("spec.augment.random_crop_padding",
                               config.augment.random_crop_padding, 0, kMaxCropPadding));
  KILN_RETURN_IF_ERROR(CheckScheduleAgainstOptimizer(config.schedule, config.optimizer));
  KILN_RETURN_IF_ERROR(TranslateRunLength(spec, limits, &config));
  if (spec.batch_size() != 0) batch_size = spec.batch_size();
  KILN_RETURN_IF_ERROR(InRange("spec.batch_size", batch_size, 1, limits.max_batch_size));
  config.batch_size = batch_size;
  config.seed = spec.seed();
  KILN_ASSIGN_OR_RETURN(config.precision, TranslatePrecision(spec.precision()));
  if (!v1::Priority_IsValid(spec.priority())) {
    return Invalid("spec.priority",
                   absl::StrCat("unknown priority ", spec.priority(),
                                " (PRIORITY_LOW, PRIORITY_NORMAL or PRIORITY_HIGH)"));
  }
  if (spec.has_normalization()) {
    KILN_ASSIGN_OR_RETURN(config.norm, TranslateNorm(spec.normalization()));
  }
  const v1::CheckpointPolicy& policy = spec.checkpoint_policy();
  KILN_RETURN_IF_ERROR(InRange("spec.checkpoint_policy.every_n_epochs", policy.every_n_epochs(), 0,
                               limits.max_epochs));
  KILN_RETURN_IF_ERROR(InRange("spec.checkpoint_policy.keep_last", policy.keep_last(), 0, 1000));

  KILN_RETURN_IF_ERROR(CheckModelFits(config, limits));
  return config;
}

int64_t ActivationBytes(const std::vector<Shape>& shapes, int64_t batch_size) {
  // In double: a hostile spec must not wrap around to a small number.
  double bytes = 0;
  for (const Shape& shape : shapes) {
    double elements = 1;
    for (int64_t d : shape) elements *= static_cast<double>(d);
    bytes += 2.0 * elements * static_cast<double>(batch_size) * sizeof(float);
  }
  constexpr double kMax = 9.2e18;  // just under INT64_MAX
  return bytes >= kMax ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(bytes);
}

}  // namespace kiln::server
