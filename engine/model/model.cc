#include "engine/model/model.h"

#include <algorithm>
#include <chrono>
#include <type_traits>
#include <variant>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/backend_checks.h"
#include "engine/layers/layers.h"
#include "engine/layers/pool2d_rules.h"
#include "engine/model/model_init.h"

namespace kiln {

namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Node i's shape rule over its inputs: add and concat take them all, other layers the one.
template <typename C>
absl::StatusOr<Shape> NodeOutputShape(const C& c, const std::vector<NodeInput>& inputs) {
  if constexpr (kTakesSeveralInputs<C>) {
    return OutputShape(c, inputs);
  } else {
    return OutputShape(c, inputs[0].shape);
  }
}

// Which values the model keeps in nChw16c on a backend that takes it (Backend::TakesNchw16c):
// images of a multiple of 16 channels and more than one pixel, between layers that all take the
// layout, so that the convolutions run without a reorder on either side. A conv2d reads and
// writes either layout (one with a layer fused onto its output keeps NCHW on both sides); batch
// norm, ReLU, add and average pooling keep their input's (ReLU and add are element-wise, blind to
// it), so all the images of such a layer share one; every other layer's inputs and outputs, the
// model's input and output, and values that fused layers alias are NCHW. An image of one pixel
// is the same bytes in either layout, so it is NCHW and joins no constraint.
std::vector<bool> Nchw16cValues(const ModelConfig& config, const ModelGraph& g,
                                const std::vector<Shape>& shapes, const std::vector<bool>& fused,
                                const std::vector<int>& fused_into) {
  const size_t n = config.layers.size();
  auto pixels = [&](size_t v) { return shapes[v].size() == 3 && shapes[v][1] * shapes[v][2] > 1; };
  auto is_conv = [&](size_t j) {
    return std::holds_alternative<Conv2dConfig>(config.layers[j]) && fused_into[j + 1] < 0;
  };
  auto keeps_layout = [&](size_t j) {
    const LayerConfig& l = config.layers[j];
    return !fused[j] &&
           (std::holds_alternative<BatchNorm2dConfig>(l) || std::holds_alternative<ReluConfig>(l) ||
            std::holds_alternative<AddConfig>(l) || std::holds_alternative<AvgPool2dConfig>(l) ||
            std::holds_alternative<AdaptiveAvgPool2dConfig>(l));
  };
  std::vector<bool> blocked(n + 1, false);
  for (size_t v = 1; v < n; ++v) {
    blocked[v] = pixels(v) && shapes[v][0] % 16 == 0 && fused_into[v] < 0 &&
                 (is_conv(v - 1) || keeps_layout(v - 1));
  }
  // Undo candidates a reader or a layout-keeping layer cannot have, until nothing changes.
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t j = 0; j < n; ++j) {
      if (is_conv(j)) continue;
      std::vector<int> group = g.inputs[j];
      if (keeps_layout(j)) group.push_back(static_cast<int>(j + 1));
      group.erase(std::remove_if(group.begin(), group.end(), [&](int v) { return !pixels(v); }),
                  group.end());
      const bool all = std::all_of(group.begin(), group.end(), [&](int v) { return blocked[v]; });
      if (keeps_layout(j) && all) continue;
      for (int v : group) {
        changed = changed || blocked[v];
        blocked[v] = false;
      }
    }
  }
  return blocked;
}

// Node i's inputs with their names and shapes.
std::vector<NodeInput> NodeInputsOf(const ModelGraph& g, const std::vector<Shape>& shapes,
                                    size_t i) {
  std::vector<NodeInput> out;
  for (int v : g.inputs[i]) out.push_back({v == 0 ? kModelInput : g.names[v - 1], shapes[v]});
  return out;
}

bool ReadsTokenIds(const LayerConfig& layer) {
  return std::visit([](const auto& c) { return kReadsTokenIds<std::decay_t<decltype(c)>>; }, layer);
}

// A token model's input is int32 ids, which only embeddings read: when one node reads the model
// input as ids, every reader must, and an embedding reads nothing else.
absl::Status CheckTokenInputs(const ModelConfig& config, const ModelGraph& g) {
  int ids_reader = -1, float_reader = -1;
  for (size_t i = 0; i < config.layers.size(); ++i) {
    const bool ids = ReadsTokenIds(config.layers[i]);
    for (int v : g.inputs[i]) {
      if (ids && v != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(NodeLabel(config, i),
                         ": reads token ids, so its input must be the "
                         "model's input, not ",
                         g.names[v - 1]));
      }
      if (v == 0) (ids ? ids_reader : float_reader) = static_cast<int>(i);
    }
  }
  if (ids_reader >= 0 && float_reader >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        NodeLabel(config, float_reader), ": reads the model's input, which holds the token ids of ",
        NodeLabel(config, ids_reader), "; only an embedding may read them"));
  }
  return absl::OkStatus();
}

// The embedding node a linear's tie_weight names, or an error naming the linear.
absl::StatusOr<size_t> TiedEmbedding(const ModelConfig& config, size_t i) {
  const auto& linear = std::get<LinearConfig>(config.layers[i]);
  for (size_t k = 0; k < config.layers.size(); ++k) {
    if (NodeName(config, k) != linear.tie_weight) continue;
    const auto* e = std::get_if<EmbeddingConfig>(&config.layers[k]);
    if (e == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(NodeLabel(config, i), ": tie_weight ",
                                                     linear.tie_weight, " is not an embedding"));
    }
    if (e->num_embeddings != linear.out_features || e->embedding_dim != linear.in_features) {
      return absl::InvalidArgumentError(
          absl::StrCat(NodeLabel(config, i), ": tie_weight ", linear.tie_weight, "'s table is ",
                       e->num_embeddings, "x", e->embedding_dim, " but the weight is ",
                       linear.out_features, "x", linear.in_features));
    }
    return k;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(NodeLabel(config, i), ": tie_weight names no node: ", linear.tie_weight));
}

absl::Status CheckTiedWeights(const ModelConfig& config) {
  for (size_t i = 0; i < config.layers.size(); ++i) {
    const auto* linear = std::get_if<LinearConfig>(&config.layers[i]);
    if (linear != nullptr && !linear->tie_weight.empty()) {
      KILN_RETURN_IF_ERROR(TiedEmbedding(config, i).status());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Shape>> ShapesOf(const ModelConfig& config, const ModelGraph& g) {
  KILN_RETURN_IF_ERROR(CheckTokenInputs(config, g));
  KILN_RETURN_IF_ERROR(CheckTiedWeights(config));
  std::vector<Shape> shapes = {config.input_shape};
  for (size_t i = 0; i < config.layers.size(); ++i) {
    const std::vector<NodeInput> inputs = NodeInputsOf(g, shapes, i);
    absl::StatusOr<Shape> out =
        std::visit([&](const auto& c) { return NodeOutputShape(c, inputs); }, config.layers[i]);
    if (!out.ok()) {
      return absl::Status(out.status().code(),
                          absl::StrCat(NodeLabel(config, i), ": ", out.status().message()));
    }
    shapes.push_back(*std::move(out));
  }
  return shapes;
}

absl::Status CheckInputShape(const ModelConfig& config) {
  if (config.input_shape.empty()) return absl::InvalidArgumentError("model input_shape is empty");
  for (int64_t d : config.input_shape) {
    if (d <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model input_shape ", ShapeString(config.input_shape), " has a non-positive dimension"));
    }
  }
  if (config.layers.empty()) return absl::InvalidArgumentError("model has no layers");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<Shape>> InferShapes(const ModelConfig& config) {
  KILN_RETURN_IF_ERROR(CheckInputShape(config));
  KILN_ASSIGN_OR_RETURN(ModelGraph graph, ResolveGraph(config));
  return ShapesOf(config, graph);
}

int64_t CountParameters(const ModelConfig& config) {
  int64_t n = 0;
  for (const auto& layer : config.layers) {
    n += std::visit([](const auto& c) { return ParameterCount(c); }, layer);
  }
  return n;
}

absl::Status CheckModelFitsData(const ModelConfig& config, const Shape& sample_shape,
                                int64_t num_classes, std::string_view which_view,
                                ModelPart* culprit) {
  const std::string which(which_view);  // Debian's Abseil: StrCat takes no std::string_view
  auto at_odds = [&](ModelPart part, std::string message) {
    if (culprit != nullptr) *culprit = part;
    return absl::InvalidArgumentError(message);
  };
  const Shape& input = config.input_shape;
  if (NumElements(sample_shape) != NumElements(input)) {
    return at_odds(ModelPart::kInputShape,
                   absl::StrCat("model input is ", ShapeString(input), " = ", NumElements(input),
                                " values but ", which, " samples are ", ShapeString(sample_shape),
                                " = ", NumElements(sample_shape)));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Shape> shapes, InferShapes(config));
  const Shape& out = shapes.back();
  if (out.size() != 1) {
    return at_odds(ModelPart::kOutputs, absl::StrCat("the model's output is ", ShapeString(out),
                                                     "; a classifier needs a flat output"));
  }
  if (num_classes > out[0]) {
    return at_odds(ModelPart::kOutputs, absl::StrCat("model has ", out[0], " outputs but the ",
                                                     which, " labels go up to ", num_classes - 1));
  }
  return absl::OkStatus();
}

absl::Status CheckBatchNormBatches(const ModelConfig& model, int64_t batch_size, int64_t samples) {
  if (batch_size < 1 || samples < 1) return absl::OkStatus();  // other checks refuse these
  const int64_t last = samples % batch_size == 0 ? batch_size : samples % batch_size;
  const int64_t smallest = std::min({batch_size, samples, last});
  if (smallest != 1) return absl::OkStatus();
  KILN_ASSIGN_OR_RETURN(std::vector<Shape> shapes, InferShapes(model));
  for (size_t i = 0; i < model.layers.size(); ++i) {
    const auto* bn2d = std::get_if<BatchNorm2dConfig>(&model.layers[i]);
    const auto* bn1d = std::get_if<BatchNorm1dConfig>(&model.layers[i]);
    if (bn2d == nullptr && bn1d == nullptr) continue;
    const int64_t features = bn2d != nullptr ? bn2d->num_features : bn1d->num_features;
    if (NumElements(shapes[i]) / features > 1) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "layer ", i, " ", LayerTypeName(model.layers[i]), ": ", samples,
        " training samples in batches of ", batch_size,
        " make a batch of 1 sample, and batch normalisation needs more than 1 value per channel "
        "in training; change batch_size"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Model>> Model::Build(const ModelConfig& config, Backend* backend,
                                                    uint64_t seed, Fusion fusion) {
  auto model = std::unique_ptr<Model>(new Model(config, backend));
  KILN_RETURN_IF_ERROR(CheckInputShape(config));
  KILN_ASSIGN_OR_RETURN(model->graph_, ResolveGraph(config));
  KILN_ASSIGN_OR_RETURN(model->shapes_, ShapesOf(config, model->graph_));
  const ModelGraph& g = model->graph_;
  const size_t n = config.layers.size();
  std::vector<int64_t> max_pool_of(n, 0);  // by conv2d layer: its fused pooling's kernel
  model->PlanFusion(fusion, &max_pool_of);
  model->PlanGradientAliases();
  auto layout = [&](int v) {
    return model->nchw16c_[v] ? ImageLayout::kNchw16c : ImageLayout::kNchw;
  };
  Rng rng(seed);
  for (size_t i = 0; i < n; ++i) {
    LayerContext ctx;
    ctx.backend = backend;
    for (int v : g.inputs[i]) ctx.inputs.push_back(model->shapes_[v]);
    ctx.input = ctx.inputs[0];
    ctx.output = model->shapes_[i + 1];
    ctx.rng = &rng;
    ctx.stream_seed = SplitMix64(seed + 0x51ED + i);
    // A conv2d or a batchnorm2d runs the ReLU fused after it.
    const int fused_next = model->fused_into_[i + 1];
    if (fused_next >= 0 && std::holds_alternative<ReluConfig>(config.layers[fused_next])) {
      ctx.fused = Activation::kRelu;
    }
    ctx.fused_max_pool = max_pool_of[i];
    // A layer that keeps its input's layout runs in it even where its output has one pixel.
    ctx.input_layout = layout(g.inputs[i][0]);
    ctx.output_layout = layout(static_cast<int>(i + 1));
    KILN_ASSIGN_OR_RETURN(
        std::unique_ptr<Layer> layer,
        std::visit([&](const auto& c) { return MakeLayer(c, ctx); }, config.layers[i]));
    model->layers_.push_back(std::move(layer));
  }
  // Tied linears share their embedding's weight and gradient (both accumulate into it).
  for (size_t i = 0; i < n; ++i) {
    const auto* linear = std::get_if<LinearConfig>(&config.layers[i]);
    if (linear == nullptr || linear->tie_weight.empty()) continue;
    KILN_ASSIGN_OR_RETURN(size_t k, TiedEmbedding(config, i));
    static_cast<Linear*>(model->layers_[i].get())
        ->BindTiedWeight(model->layers_[k]->parameters()[0]);
  }
  int64_t n_layer = 0;  // kGpt2 scales the residual projections by the attention layers
  for (const LayerConfig& l : config.layers)
    n_layer += std::holds_alternative<CausalSelfAttentionConfig>(l);
  KILN_RETURN_IF_ERROR(ApplyInitRule(config.init, n_layer, seed, backend, model->parameters()));
  model->scratch_elements_ = GradientScratchElements(g, model->shapes_);
  return model;
}

void Model::PlanFusion(Fusion fusion, std::vector<int64_t>* max_pool_of) {
  const ModelConfig& config = config_;
  const ModelGraph& g = graph_;
  const size_t n = config.layers.size();
  fused_.assign(n, false);
  fused_into_.assign(n + 1, -1);
  nchw16c_.assign(n + 1, false);
  if (fusion == Fusion::kNone) return;
  auto fuse = [&](size_t j, int v) {
    fused_[j] = true;
    fused_into_[v] = static_cast<int>(j);
  };
  // A ReLU fuses into the conv2d whose output it reads when nothing else reads that output; a
  // max pooling of non-overlapping windows then into that conv2d too (after the ReLU, if any),
  // where the backend runs the pair (Backend::FusesConvMaxPool).
  for (size_t j = 0; j < n; ++j) {
    const int v = g.inputs[j][0];
    if (std::holds_alternative<ReluConfig>(config.layers[j]) && v > 0 && g.readers[v] == 1 &&
        std::holds_alternative<Conv2dConfig>(config.layers[v - 1])) {
      fuse(j, v);
    }
  }
  for (size_t j = 0; j < n && backend_->FusesConvMaxPool(); ++j) {
    const auto* pool = std::get_if<MaxPool2dConfig>(&config.layers[j]);
    const int v = g.inputs[j][0];
    if (pool == nullptr || v == 0 || g.readers[v] != 1) continue;
    // The conv2d producing v, directly or through its fused ReLU.
    const int producer = fused_[v - 1] ? g.inputs[v - 1][0] - 1 : v - 1;
    const auto* conv = std::get_if<Conv2dConfig>(&config.layers[producer]);
    if (conv == nullptr) continue;
    // The backend's own rule (windows, padding, winner bytes), on a one-sample geometry.
    const Shape& conv_input = shapes_[g.inputs[producer][0]];
    if (!CheckFusableMaxPool(
             MakeConv2dGeometry(*conv, conv_input, 1),
             MakePool2dGeometry(pool->kernel_size, pool->stride, pool->padding, shapes_[v], 1))
             .ok()) {
      continue;
    }
    fuse(j, v);
    (*max_pool_of)[producer] = pool->kernel_size;
  }
  if (backend_->TakesNchw16c()) nchw16c_ = Nchw16cValues(config, g, shapes_, fused_, fused_into_);
  // Then a ReLU into the batchnorm2d whose nChw16c output only it reads, where the backend runs
  // the pair (Backend::FusesBatchNormRelu); its layout is the batch norm's already.
  for (size_t j = 0; j < n && backend_->FusesBatchNormRelu(); ++j) {
    const int v = g.inputs[j][0];
    if (std::holds_alternative<ReluConfig>(config.layers[j]) && v > 0 && g.readers[v] == 1 &&
        std::holds_alternative<BatchNorm2dConfig>(config.layers[v - 1]) && nchw16c_[v]) {
      fuse(j, v);
    }
  }
}

void Model::PlanGradientAliases() {
  const size_t n = config_.layers.size();
  grad_alias_.assign(n + 1, -1);
  for (size_t j = 0; j < n; ++j) {
    if (fused_[j] || !std::holds_alternative<AddConfig>(config_.layers[j])) continue;
    const size_t out = ChainEnd(j + 1);
    if (out == n) continue;  // the add's output gradient is the caller's dout
    for (int v : graph_.inputs[j]) {
      if (v > 0 && graph_.readers[v] == 1 && fused_into_[v] < 0) {
        grad_alias_[v] = static_cast<int>(out);
      }
    }
  }
}

absl::Status Model::EnsureActivations(int64_t batch) {
  auto batched = [&](const Shape& per_sample) {
    Shape s = per_sample;
    s.insert(s.begin(), batch);
    return s;
  };
  const size_t n = layers_.size();
  // A fused layer's output aliases its input; the gradient of its input is never formed. The
  // last gradient is the caller's dout; grads_[0] (the input's) is never needed.
  auto has_grad = [&](size_t v) { return v > 0 && v < n && fused_into_[v] < 0; };
  auto owns_grad = [&](size_t v) { return has_grad(v) && grad_alias_[v] < 0; };
  if (batch > capacity_) {
    activations_.assign(n + 1, Tensor());
    grads_.assign(n + 1, Tensor());
    scratch_.assign(scratch_elements_.size(), Tensor());
    for (size_t v = 1; v <= n; ++v) {
      if (!fused_[v - 1]) {
        KILN_ASSIGN_OR_RETURN(activations_[v],
                              backend_->Allocate(DType::kF32, batched(shapes_[ChainEnd(v)])));
      }
      if (owns_grad(v)) {
        KILN_ASSIGN_OR_RETURN(grads_[v], backend_->Allocate(DType::kF32, batched(shapes_[v])));
      }
    }
    for (size_t k = 0; k < scratch_.size(); ++k) {
      if (scratch_elements_[k] == 0) continue;
      KILN_ASSIGN_OR_RETURN(scratch_[k],
                            backend_->Allocate(DType::kF32, {batch, scratch_elements_[k]}));
    }
    capacity_ = batch;
  }
  for (size_t v = 1; v <= n; ++v) {
    if (fused_[v - 1]) {
      activations_[v] = activations_[graph_.inputs[v - 1][0]];
    } else {
      activations_[v].Reshape(batched(shapes_[ChainEnd(v)]));
    }
    if (owns_grad(v)) grads_[v].Reshape(batched(shapes_[v]));
  }
  for (size_t v = 1; v < n; ++v) {
    if (has_grad(v) && grad_alias_[v] >= 0) grads_[v] = grads_[grad_alias_[v]];
  }
  return absl::OkStatus();
}

size_t Model::ChainEnd(size_t v) const {
  while (fused_into_[v] >= 0) v = static_cast<size_t>(fused_into_[v]) + 1;
  return v;
}

const Tensor& Model::OutputGrad(size_t i, const Tensor& dout) const {
  const size_t v = ChainEnd(i + 1);  // activations_[i+1] is layer i's output; fused layers alias it
  return v == layers_.size() ? dout : grads_[v];
}

absl::StatusOr<const Tensor*> Model::Forward(const Tensor& x, Mode mode) {
  if (x.rank() == 0 || x.numel() != x.dim(0) * NumElements(shapes_[0])) {
    return absl::InvalidArgumentError(absl::StrCat("model input is ", ShapeString(x.shape()),
                                                   " but the model expects batch x ",
                                                   ShapeString(shapes_[0])));
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    const std::vector<int>& in = graph_.inputs[i];
    if (std::find(in.begin(), in.end(), 0) == in.end()) continue;
    if (layers_[i]->input_dtype() != x.dtype()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model input is ", DTypeName(x.dtype()), " but ", NodeLabel(config_, i),
                       " reads ", DTypeName(layers_[i]->input_dtype()),
                       layers_[i]->input_dtype() == DType::kI32 ? " token ids" : ""));
    }
  }
  KILN_RETURN_IF_ERROR(EnsureActivations(x.dim(0)));
  input_ = &x;
  // Only training passes are timed: evaluation forwards would dilute the per-step numbers.
  LayerTimes* times = mode == Mode::kTrain ? layer_times_ : nullptr;
  if (times != nullptr) ++times->forward_calls;
  std::vector<const Tensor*> xs;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (fused_[i]) continue;
    xs.clear();
    for (int v : graph_.inputs[i]) xs.push_back(v == 0 ? &x : &activations_[v]);
    const auto start = times != nullptr ? std::chrono::steady_clock::now()
                                        : std::chrono::steady_clock::time_point();
    KILN_RETURN_IF_ERROR(layers_[i]->ForwardInputs(xs, &activations_[i + 1], mode));
    if (times != nullptr) {
      KILN_RETURN_IF_ERROR(backend_->Synchronize());
      times->forward_s[i] += SecondsSince(start);
    }
  }
  return &activations_.back();
}

absl::Status Model::Backward(const Tensor& dout) {
  if (input_ == nullptr) return absl::FailedPreconditionError("Backward before Forward");
  if (layer_times_ != nullptr) ++layer_times_->backward_calls;
  std::vector<const Tensor*> xs;
  std::vector<Tensor*> dxs;
  for (size_t i = layers_.size(); i-- > 0;) {
    if (fused_[i]) continue;
    const std::vector<int>& inputs = graph_.inputs[i];
    xs.clear();
    dxs.clear();
    for (size_t k = 0; k < inputs.size(); ++k) {
      const int v = inputs[k];
      xs.push_back(v == 0 ? input_ : &activations_[v]);
      if (v == 0) {
        dxs.push_back(nullptr);
      } else if (graph_.sums_gradient[i][k]) {
        scratch_[k].Reshape(activations_[v].shape());
        dxs.push_back(&scratch_[k]);
      } else {
        dxs.push_back(&grads_[v]);
      }
    }
    const auto start = layer_times_ != nullptr ? std::chrono::steady_clock::now()
                                               : std::chrono::steady_clock::time_point();
    KILN_RETURN_IF_ERROR(
        layers_[i]->BackwardInputs(xs, activations_[i + 1], OutputGrad(i, dout), dxs));
    // A value read by several slots: its later readers wrote its gradient; add this one's.
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (!graph_.sums_gradient[i][k]) continue;
      Tensor& g = grads_[inputs[k]];
      KILN_RETURN_IF_ERROR(backend_->Add(g.numel(), g.f32(), scratch_[k].f32(), g.f32()));
    }
    if (layer_times_ != nullptr) {
      KILN_RETURN_IF_ERROR(backend_->Synchronize());
      layer_times_->backward_s[i] += SecondsSince(start);
    }
  }
  return absl::OkStatus();
}

void Model::set_layer_times(LayerTimes* times) {
  layer_times_ = times;
  if (times != nullptr) {
    times->forward_s.resize(layers_.size(), 0.0);
    times->backward_s.resize(layers_.size(), 0.0);
  }
}

absl::Status Model::ZeroGrad() {
  for (auto& layer : layers_) {
    for (Parameter* p : layer->parameters()) KILN_RETURN_IF_ERROR(backend_->Fill(&p->grad, 0.0f));
  }
  return absl::OkStatus();
}

std::vector<NamedParameter> Model::parameters() {
  // A tied weight is its embedding's: the linear sharing it does not list it (Linear).
  std::vector<NamedParameter> out;
  for (size_t i = 0; i < layers_.size(); ++i) {
    for (Parameter* p : layers_[i]->parameters()) {
      out.push_back({StateDictName(graph_.names[i], p->name), p});
    }
  }
  return out;
}

std::vector<NamedBuffer> Model::buffers() {
  std::vector<NamedBuffer> out;
  for (size_t i = 0; i < layers_.size(); ++i) {
    for (StateBuffer* b : layers_[i]->buffers()) {
      out.push_back({StateDictName(graph_.names[i], b->name), b});
    }
  }
  return out;
}

int64_t Model::parameter_count() const { return CountParameters(config_); }

std::vector<uint64_t> Model::random_offsets() const {
  std::vector<uint64_t> out;
  for (const auto& layer : layers_) {
    if (layer->has_random_stream()) out.push_back(layer->random_offset());
  }
  return out;
}

absl::Status Model::set_random_offsets(const std::vector<uint64_t>& offsets) {
  size_t i = 0;
  for (auto& layer : layers_) {
    if (layer->has_random_stream()) {
      if (i >= offsets.size()) break;
      layer->set_random_offset(offsets[i++]);
    }
  }
  if (i != offsets.size() || i != random_offsets().size()) {
    return absl::InvalidArgumentError(absl::StrCat("model has ", random_offsets().size(),
                                                   " dropout layers but ", offsets.size(),
                                                   " random offsets were given"));
  }
  return absl::OkStatus();
}

}  // namespace kiln
