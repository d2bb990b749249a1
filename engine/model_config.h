// A model as plain data: the engine's mirror of the ModelSpec message. Built by BuildModel().
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "engine/tensor.h"

namespace kiln {

struct LinearConfig {
  int64_t in_features = 0, out_features = 0;
  bool bias = true;
};
struct Conv2dConfig {
  int64_t in_channels = 0, out_channels = 0, kernel_size = 3, stride = 1, padding = 0;
  bool bias = true;
};
struct ReluConfig {};
struct MaxPool2dConfig {
  int64_t kernel_size = 2, stride = 0;  // stride 0 means stride = kernel_size, as in PyTorch.
};
struct FlattenConfig {};
struct DropoutConfig {
  float p = 0.5f;
};
// Softmax over the last dimension; for inference outputs (training uses the fused loss).
struct SoftmaxConfig {};
// Element-wise sum of 2+ inputs of identical shape (a residual connection).
struct AddConfig {};
// 2+ inputs joined along their first per-sample dimension (the channels of CxHxW images, the
// features of vectors); their other dimensions must agree.
struct ConcatConfig {};

using LayerConfig =
    std::variant<LinearConfig, Conv2dConfig, ReluConfig, MaxPool2dConfig, FlattenConfig,
                 DropoutConfig, SoftmaxConfig, AddConfig, ConcatConfig>;

// Layers over several inputs (add, concat); every other layer reads one.
template <typename C>
inline constexpr bool kTakesSeveralInputs =
    std::is_same_v<C, AddConfig> || std::is_same_v<C, ConcatConfig>;

// "linear", "conv2d", ...: the name used in messages, specs and the CLI.
const char* LayerTypeName(const LayerConfig& layer);

// A model is a DAG of nodes, one per entry of `layers`; the last node's output is the model's.
// names[i] names node i ("" or absent: its index, "3", so Sequential state-dict names stay);
// inputs[i] lists the earlier nodes it reads, or kModelInput (empty or absent: the previous
// node's output, the model input for node 0). A Sequential model leaves both empty.
// ResolveGraph (engine/model_graph.h) checks them.
struct ModelConfig {
  Shape input_shape;  // per sample, e.g. {784} or {1, 28, 28}
  std::vector<LayerConfig> layers;
  // Initialised, so that {input_shape, layers} braces stay warning-free.
  std::vector<std::string> names = {};                // at most one per layer
  std::vector<std::vector<std::string>> inputs = {};  // at most one list per layer
};

// The name a node's inputs use for the model's input.
inline constexpr char kModelInput[] = "input";

// Node i's name: names[i], or its index when it has none.
std::string NodeName(const ModelConfig& config, size_t i);
// Node i's inputs as written (empty: the previous node's output).
const std::vector<std::string>& NodeInputs(const ModelConfig& config, size_t i);

// The two reference models of the mission (PyTorch nn.Sequential layouts).
ModelConfig MnistMlpConfig();  // 784-512-256-10 with ReLU
ModelConfig MnistCnnConfig();  // conv3x3 32, pool, conv3x3 64, pool, fc 128, fc 10

}  // namespace kiln
