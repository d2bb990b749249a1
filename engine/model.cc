#include "engine/model.h"

#include <chrono>
#include <variant>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/layers/layers.h"

namespace kiln {

namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

absl::StatusOr<std::vector<Shape>> InferShapes(const ModelConfig& config) {
  if (config.input_shape.empty()) return absl::InvalidArgumentError("model input_shape is empty");
  for (int64_t d : config.input_shape) {
    if (d <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model input_shape ", ShapeString(config.input_shape), " has a non-positive dimension"));
    }
  }
  if (config.layers.empty()) return absl::InvalidArgumentError("model has no layers");
  std::vector<Shape> shapes = {config.input_shape};
  for (size_t i = 0; i < config.layers.size(); ++i) {
    const Shape& in = shapes.back();
    absl::StatusOr<Shape> out =
        std::visit([&](const auto& c) { return OutputShape(c, in); }, config.layers[i]);
    if (!out.ok()) {
      return absl::Status(out.status().code(),
                          absl::StrCat("layer ", i, " ", LayerTypeName(config.layers[i]), ": ",
                                       out.status().message()));
    }
    shapes.push_back(*std::move(out));
  }
  return shapes;
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

absl::StatusOr<std::unique_ptr<Model>> Model::Build(const ModelConfig& config, Backend* backend,
                                                    uint64_t seed, Fusion fusion) {
  auto model = std::unique_ptr<Model>(new Model(config, backend));
  KILN_ASSIGN_OR_RETURN(model->shapes_, InferShapes(config));
  Rng rng(seed);
  for (size_t i = 0; i < config.layers.size(); ++i) {
    const Shape& in = model->shapes_[i];
    const Shape& out = model->shapes_[i + 1];
    const LayerConfig& lc = config.layers[i];
    const bool relu_follows = fusion == Fusion::kFuse && i + 1 < config.layers.size() &&
                              std::holds_alternative<ReluConfig>(config.layers[i + 1]);
    LayerContext ctx;
    ctx.backend = backend;
    ctx.input = in;
    ctx.output = out;
    ctx.rng = &rng;
    ctx.stream_seed = SplitMix64(seed + 0x51ED + i);
    // Only a conv2d fuses the ReLU after it (cuDNN's conv-bias-activation).
    if (relu_follows && std::holds_alternative<Conv2dConfig>(lc)) ctx.fused = Activation::kRelu;
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Layer> layer,
                          std::visit([&](const auto& c) { return MakeLayer(c, ctx); }, lc));
    model->layers_.push_back(std::move(layer));
    // A ReLU right after a conv2d built with the fused activation does nothing itself.
    model->fused_.push_back(i > 0 && fusion == Fusion::kFuse &&
                            std::holds_alternative<ReluConfig>(lc) &&
                            std::holds_alternative<Conv2dConfig>(config.layers[i - 1]));
  }
  return model;
}

absl::Status Model::EnsureActivations(int64_t batch) {
  auto batched = [&](size_t i) {
    Shape s = shapes_[i];
    s.insert(s.begin(), batch);
    return s;
  };
  if (batch > capacity_) {
    activations_.assign(layers_.size() + 1, Tensor());
    grads_.assign(layers_.size() + 1, Tensor());
    for (size_t i = 1; i <= layers_.size(); ++i) {
      // A fused layer's output aliases its input; the gradient of its input is never formed.
      if (!fused_[i - 1]) {
        KILN_ASSIGN_OR_RETURN(activations_[i], backend_->Allocate(DType::kF32, batched(i)));
      }
      // The last gradient is the caller's dout; grads_[0] (the input's) is never needed.
      if (i < layers_.size() && !fused_[i]) {
        KILN_ASSIGN_OR_RETURN(grads_[i], backend_->Allocate(DType::kF32, batched(i)));
      }
    }
    capacity_ = batch;
  }
  for (size_t i = 1; i <= layers_.size(); ++i) {
    if (fused_[i - 1]) {
      activations_[i] = activations_[i - 1];
    } else {
      activations_[i].Reshape(batched(i));
    }
    if (i < layers_.size() && !fused_[i]) grads_[i].Reshape(batched(i));
  }
  return absl::OkStatus();
}

const Tensor& Model::OutputGrad(size_t i, const Tensor& dout) const {
  size_t k = i + 1;  // activations_[k] is layer i's output; fused layers k.. alias it
  while (k < layers_.size() && fused_[k]) ++k;
  return k == layers_.size() ? dout : grads_[k];
}

absl::StatusOr<const Tensor*> Model::Forward(const Tensor& x, Mode mode) {
  if (x.rank() == 0 || x.numel() != x.dim(0) * NumElements(shapes_[0])) {
    return absl::InvalidArgumentError(absl::StrCat("model input is ", ShapeString(x.shape()),
                                                   " but the model expects batch x ",
                                                   ShapeString(shapes_[0])));
  }
  KILN_RETURN_IF_ERROR(EnsureActivations(x.dim(0)));
  input_ = &x;
  // Only training passes are timed: evaluation forwards would dilute the per-step numbers.
  LayerTimes* times = mode == Mode::kTrain ? layer_times_ : nullptr;
  if (times != nullptr) ++times->forward_calls;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (fused_[i]) continue;
    const Tensor& in = i == 0 ? x : activations_[i];
    const auto start = times != nullptr ? std::chrono::steady_clock::now()
                                        : std::chrono::steady_clock::time_point();
    KILN_RETURN_IF_ERROR(layers_[i]->Forward(in, &activations_[i + 1], mode));
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
  for (size_t i = layers_.size(); i-- > 0;) {
    if (fused_[i]) continue;
    const Tensor& x = i == 0 ? *input_ : activations_[i];
    const auto start = layer_times_ != nullptr ? std::chrono::steady_clock::now()
                                               : std::chrono::steady_clock::time_point();
    KILN_RETURN_IF_ERROR(layers_[i]->Backward(x, activations_[i + 1], OutputGrad(i, dout),
                                              i == 0 ? nullptr : &grads_[i]));
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

std::string Model::StateDictName(size_t i, const std::string& local) const {
  return absl::StrCat(i, ".", local);
}

std::vector<NamedParameter> Model::parameters() {
  std::vector<NamedParameter> out;
  for (size_t i = 0; i < layers_.size(); ++i) {
    for (Parameter* p : layers_[i]->parameters()) out.push_back({StateDictName(i, p->name), p});
  }
  return out;
}

std::vector<NamedBuffer> Model::buffers() {
  std::vector<NamedBuffer> out;
  for (size_t i = 0; i < layers_.size(); ++i) {
    for (StateBuffer* b : layers_[i]->buffers()) out.push_back({StateDictName(i, b->name), b});
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
