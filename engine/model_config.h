// A model as plain data: the engine's mirror of the ModelSpec message. Built by BuildModel().
#pragma once

#include <cstdint>
#include <string>
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

using LayerConfig = std::variant<LinearConfig, Conv2dConfig, ReluConfig, MaxPool2dConfig,
                                 FlattenConfig, DropoutConfig, SoftmaxConfig>;

// "linear", "conv2d", ...: the name used in messages, specs and the CLI.
const char* LayerTypeName(const LayerConfig& layer);

struct ModelConfig {
  Shape input_shape;  // per sample, e.g. {784} or {1, 28, 28}
  std::vector<LayerConfig> layers;
};

// The two reference models of the mission (PyTorch nn.Sequential layouts).
ModelConfig MnistMlpConfig();  // 784-512-256-10 with ReLU
ModelConfig MnistCnnConfig();  // conv3x3 32, pool, conv3x3 64, pool, fc 128, fc 10

}  // namespace kiln
