// A model as plain data: the engine's mirror of the ModelSpec message. Built by BuildModel().
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "engine/tensor.h"

namespace kiln {

struct LinearConfig {
  int64_t in_features = 0, out_features = 0;
  bool bias = true;
  // Weight tying (GPT-2's lm_head): the name of an embedding node whose (num_embeddings,
  // embedding_dim) table this (out_features, in_features) weight is. One parameter, listed (and
  // checkpointed) once, under the embedding's name; empty for an own weight.
  std::string tie_weight = "";
};
struct Conv2dConfig {
  int64_t in_channels = 0, out_channels = 0, kernel_size = 3, stride = 1, padding = 0;
  bool bias = true;
  // Per-axis forms (PyTorch's (h, w) tuples); each one unset takes the square form above.
  std::optional<int64_t> kernel_h = std::nullopt, kernel_w = std::nullopt;
  std::optional<int64_t> stride_h = std::nullopt, stride_w = std::nullopt;
  std::optional<int64_t> padding_h = std::nullopt, padding_w = std::nullopt;
  int64_t KernelH() const { return kernel_h.value_or(kernel_size); }
  int64_t KernelW() const { return kernel_w.value_or(kernel_size); }
  int64_t StrideH() const { return stride_h.value_or(stride); }
  int64_t StrideW() const { return stride_w.value_or(stride); }
  int64_t PaddingH() const { return padding_h.value_or(padding); }
  int64_t PaddingW() const { return padding_w.value_or(padding); }
};
struct ReluConfig {};
// Square windows; padded positions never win; padding at most kernel_size / 2 (PyTorch's rule).
struct MaxPool2dConfig {
  int64_t kernel_size = 2, stride = 0;  // stride 0 means stride = kernel_size, as in PyTorch.
  int64_t padding = 0;
};
// Mean over square windows, padding counted as zeros (PyTorch's count_include_pad=True).
struct AvgPool2dConfig {
  int64_t kernel_size = 2, stride = 0;  // stride 0 means stride = kernel_size, as in PyTorch.
  int64_t padding = 0;
};
// PyTorch's AdaptiveAvgPool2d((output_h, output_w)) where each input side is a multiple of the
// output side (1x1, global average pooling, always is): even windows of input / output.
struct AdaptiveAvgPool2dConfig {
  int64_t output_h = 1, output_w = 1;
};
// The element-wise activations besides ReLU (engine/backend.h's ActivationKind).
struct TanhConfig {};
struct SigmoidConfig {};
struct GeluConfig {};  // exact (erf) form, PyTorch's approximate='none'
struct LeakyReluConfig {
  float negative_slope = 0.01f;
};
struct SiluConfig {};
struct FlattenConfig {};
struct DropoutConfig {
  float p = 0.5f;
};
// Batch normalisation as torch.nn.BatchNorm2d (input CxHxW, statistics per channel over N, H, W)
// and torch.nn.BatchNorm1d (input F or CxL, statistics per feature over N, or N and L). Running
// statistics are always tracked; momentum is PyTorch's (running = (1 - m) * running + m * batch).
struct BatchNormFields {
  int64_t num_features = 0;
  double eps = 1e-5, momentum = 0.1;
  bool affine = true;
};
struct BatchNorm2dConfig : BatchNormFields {};
struct BatchNorm1dConfig : BatchNormFields {};
// Layer normalisation as torch.nn.LayerNorm(normalized_shape) over the last dimension of a
// sample of any rank (each position of a (T, d) sequence); elementwise_affine is `affine`, and
// bias (nanoGPT's option) only counts with it.
struct LayerNormConfig {
  int64_t normalized_shape = 0;
  double eps = 1e-5;
  bool affine = true, bias = true;
};
// A token embedding as torch.nn.Embedding(num_embeddings, embedding_dim): reads the model's int32
// input of T token ids per sample (only an embedding may) and gives (T, embedding_dim).
struct EmbeddingConfig {
  int64_t num_embeddings = 0, embedding_dim = 0;
};
// A learned position embedding (nanoGPT's wpe): adds the first T rows of a (block_size,
// embedding_dim) table to its (T, embedding_dim) input, T <= block_size.
struct PositionEmbeddingConfig {
  int64_t block_size = 0, embedding_dim = 0;
};
// Causal multi-head self-attention over a (T, n_embd) sequence, nanoGPT's CausalSelfAttention:
// c_attn, heads, c_proj; dropout on the attention weights and on the output in training.
struct CausalSelfAttentionConfig {
  int64_t n_head = 0, n_embd = 0;
  bool bias = true;
  float dropout = 0.0f;
};
// Softmax over the last dimension; for inference outputs (training uses the fused loss).
struct SoftmaxConfig {};
// Element-wise sum of 2+ inputs of identical shape (a residual connection).
struct AddConfig {};
// 2+ inputs joined along their first per-sample dimension (the channels of CxHxW images, the
// features of vectors); their other dimensions must agree.
struct ConcatConfig {};

using LayerConfig = std::variant<LinearConfig, Conv2dConfig, ReluConfig, MaxPool2dConfig,
                                 FlattenConfig, DropoutConfig, SoftmaxConfig,
                                 // pooling and activations (issue 19)
                                 AvgPool2dConfig, AdaptiveAvgPool2dConfig, TanhConfig,
                                 SigmoidConfig, GeluConfig, LeakyReluConfig, SiluConfig,
                                 // normalisation
                                 BatchNorm2dConfig, BatchNorm1dConfig,
                                 // graph merges
                                 AddConfig, ConcatConfig,
                                 // sequences (transformers)
                                 LayerNormConfig, EmbeddingConfig, PositionEmbeddingConfig,
                                 CausalSelfAttentionConfig>;

// Layers over several inputs (add, concat); every other layer reads one.
template <typename C>
inline constexpr bool kTakesSeveralInputs =
    std::is_same_v<C, AddConfig> || std::is_same_v<C, ConcatConfig>;

// Layers that read the model's int32 token ids (and nothing else).
template <typename C>
inline constexpr bool kReadsTokenIds = std::is_same_v<C, EmbeddingConfig>;

// "linear", "conv2d", ...: the name used in messages, specs and the CLI.
const char* LayerTypeName(const LayerConfig& layer);

// A model is a DAG of nodes, one per entry of `layers`; the last node's output is the model's.
// names[i] names node i ("" or absent: its index, "3", so Sequential state-dict names stay);
// inputs[i] lists the earlier nodes it reads, or kModelInput (empty or absent: the previous
// node's output, the model input for node 0). A Sequential model leaves both empty.
// ResolveGraph (engine/model/model_graph.h) checks them.
// How parameters are first drawn. kDefault: each layer's own, PyTorch's module defaults.
// kGpt2: GPT-2's and nanoGPT's rule over the whole model: every parameter of 2+ dimensions from
// N(0, 0.02), those named "*.c_proj.weight" (the residual projections) from
// N(0, 0.02 / sqrt(2 n_layer)) with n_layer the model's causal_self_attention layers, every
// "*.bias" zero; other 1-D parameters (layer norms' scales) keep their layer's value.
enum class InitRule { kDefault, kGpt2 };

struct ModelConfig {
  Shape input_shape;  // per sample, e.g. {784} or {1, 28, 28}
  std::vector<LayerConfig> layers;
  // Initialised, so that {input_shape, layers} braces stay warning-free.
  std::vector<std::string> names = {};                // at most one per layer
  std::vector<std::vector<std::string>> inputs = {};  // at most one list per layer
  InitRule init = InitRule::kDefault;
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
