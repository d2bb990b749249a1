#include "engine/model/model_config.h"

#include <string>
#include <vector>

namespace kiln {

namespace {
struct TypeName {
  const char* operator()(const LinearConfig&) const { return "linear"; }
  const char* operator()(const Conv2dConfig&) const { return "conv2d"; }
  const char* operator()(const ReluConfig&) const { return "relu"; }
  const char* operator()(const MaxPool2dConfig&) const { return "maxpool2d"; }
  const char* operator()(const FlattenConfig&) const { return "flatten"; }
  const char* operator()(const DropoutConfig&) const { return "dropout"; }
  const char* operator()(const SoftmaxConfig&) const { return "softmax"; }
  const char* operator()(const AvgPool2dConfig&) const { return "avgpool2d"; }
  const char* operator()(const AdaptiveAvgPool2dConfig&) const { return "adaptive_avgpool2d"; }
  const char* operator()(const TanhConfig&) const { return "tanh"; }
  const char* operator()(const SigmoidConfig&) const { return "sigmoid"; }
  const char* operator()(const GeluConfig&) const { return "gelu"; }
  const char* operator()(const LeakyReluConfig&) const { return "leaky_relu"; }
  const char* operator()(const SiluConfig&) const { return "silu"; }
  const char* operator()(const BatchNorm2dConfig&) const { return "batchnorm2d"; }
  const char* operator()(const BatchNorm1dConfig&) const { return "batchnorm1d"; }
  const char* operator()(const AddConfig&) const { return "add"; }
  const char* operator()(const ConcatConfig&) const { return "concat"; }
  const char* operator()(const LayerNormConfig&) const { return "layernorm"; }
  const char* operator()(const EmbeddingConfig&) const { return "embedding"; }
  const char* operator()(const PositionEmbeddingConfig&) const { return "position_embedding"; }
  const char* operator()(const CausalSelfAttentionConfig&) const { return "causal_self_attention"; }
};
}  // namespace

const char* LayerTypeName(const LayerConfig& layer) { return std::visit(TypeName{}, layer); }

std::string NodeName(const ModelConfig& config, size_t i) {
  if (i < config.names.size() && !config.names[i].empty()) return config.names[i];
  return std::to_string(i);
}

const std::vector<std::string>& NodeInputs(const ModelConfig& config, size_t i) {
  static const std::vector<std::string> kNone;
  return i < config.inputs.size() ? config.inputs[i] : kNone;
}

ModelConfig MnistMlpConfig() {
  ModelConfig c;
  c.input_shape = {784};
  c.layers = {LinearConfig{784, 512}, ReluConfig{}, LinearConfig{512, 256}, ReluConfig{},
              LinearConfig{256, 10}};
  return c;
}

ModelConfig MnistCnnConfig() {
  ModelConfig c;
  c.input_shape = {1, 28, 28};
  c.layers = {Conv2dConfig{1, 32, 3},  ReluConfig{},  MaxPool2dConfig{2}, Conv2dConfig{32, 64, 3},
              ReluConfig{},            MaxPool2dConfig{2}, FlattenConfig{},
              LinearConfig{64 * 5 * 5, 128}, ReluConfig{}, LinearConfig{128, 10}};
  return c;
}

}  // namespace kiln
