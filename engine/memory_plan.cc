#include "engine/memory_plan.h"

#include <algorithm>
#include <limits>
#include <type_traits>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/byte_size.h"
#include "common/status_macros.h"
#include "engine/backend_registry.h"
#include "engine/layers/attention.h"
#include "engine/layers/conv2d.h"
#include "engine/model/model.h"
#include "engine/model/model_graph.h"

namespace kiln {
namespace {

constexpr int64_t kFloat = sizeof(float);
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// a * b without wrapping: a hostile spec must not overflow into a small number.
int64_t Mul(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return 0;
  return a > kMax / b ? kMax : a * b;
}
int64_t Add(int64_t a, int64_t b) { return a > kMax - b ? kMax : a + b; }

// The largest A plus B, in elements, of the GEMMs a layer runs on `capacity` samples (forward
// and both backward products), for the CPU backend's bfloat16 copies of them (bf16, one pair
// shared by every GEMM, grown to the largest). 0 for a layer without GEMMs.
int64_t Bf16GemmOperandElements(const LayerConfig& layer, const Shape& input, const Shape& output,
                                int64_t capacity) {
  const int64_t x = Mul(NumElements(input), capacity), y = Mul(NumElements(output), capacity);
  if (const auto* c = std::get_if<LinearConfig>(&layer)) {
    const int64_t w = Mul(c->in_features, c->out_features);
    // y = x W^T, dx = dy W, dW = dy^T x.
    return std::max({Add(x, w), Add(y, w), Add(y, x)});
  }
  if (const auto* c = std::get_if<CausalSelfAttentionConfig>(&layer)) {
    // The q, k, v projection (3d outputs) and its backward products, the T x T scores of every
    // head against v, and the output projection.
    const int64_t d = c->n_embd, t = input.empty() ? 0 : input[0];
    const int64_t qkv = Mul(3, x), w_qkv = Mul(3 * d, d);
    const int64_t scores = Mul(Mul(Mul(c->n_head, t), t), capacity);
    return std::max(
        {Add(x, w_qkv), Add(qkv, w_qkv), Add(qkv, x), Add(scores, x), Add(Mul(2, x), Mul(d, d))});
  }
  return 0;
}

// The convolution workspace of layer `i` on `target`, for a training batch and an evaluation
// (forward-only) batch. The backend keeps one workspace grown to the largest plan: the training
// batch's backward or the forward at the larger batch (on CUDA, the fixed limit either way).
int64_t LayerConvWorkspaceBytes(const Conv2dConfig& c, const Shape& input, int64_t train_batch,
                                int64_t eval_batch, const MemoryTarget& target) {
  int64_t bytes = 0;
  if (train_batch > 0) {
    bytes = ConvWorkspaceBytes(target.device, MakeConv2dGeometry(c, input, train_batch),
                               target.threads, ConvPass::kBackward, target.precision);
  }
  const int64_t batch = std::max(train_batch, eval_batch);
  return std::max(bytes, ConvWorkspaceBytes(target.device, MakeConv2dGeometry(c, input, batch),
                                            target.threads, ConvPass::kForward, target.precision));
}

// Per layer: activations and their gradients at `capacity` samples (the model keeps both at
// the largest batch it has run; counted for every layer, fused or not), the layer's own
// buffers, and its workspace. Adds the largest workspace once: the backend shares one. A graph
// adds the scratch where backward sums the gradients of an output read by several nodes.
absl::Status AddLayerNeeds(const ModelConfig& model, const std::vector<Shape>& shapes,
                           int64_t capacity, int64_t train_batch, int64_t eval_batch,
                           const MemoryTarget& target, MemoryPlan* plan) {
  KILN_ASSIGN_OR_RETURN(ModelGraph graph, ResolveGraph(model));
  MemoryNeed workspace{-1, "conv2d workspace", 0};
  MemoryNeed bf16_copies{-1, "bf16 GEMM operand copies", 0};
  const bool bf16_gemms = target.device == DeviceKind::kCpu && target.precision == Precision::kBf16;
  for (size_t i = 0; i < model.layers.size(); ++i) {
    const int layer = static_cast<int>(i);
    const int64_t out = Mul(NumElements(shapes[i + 1]), capacity);
    plan->needs.push_back({layer, absl::StrCat(LayerTypeName(model.layers[i]), " activations"),
                           Mul(2 * out, kFloat)});
    if (bf16_gemms) {
      const int64_t bytes = Mul(Bf16GemmOperandElements(model.layers[i], shapes[graph.inputs[i][0]],
                                                        shapes[i + 1], capacity),
                                sizeof(uint16_t));
      if (bytes > bf16_copies.bytes) bf16_copies = {layer, "bf16 GEMM operand copies", bytes};
    }
    std::visit(
        [&](const auto& c) {
          using C = std::decay_t<decltype(c)>;
          if constexpr (std::is_same_v<C, MaxPool2dConfig>) {
            // (Fused into the conv2d before it, a byte per value: its winners. The backend's
            // scratch for the conv2d's output is within the fused layers' activations counted.)
            plan->needs.push_back({layer, "maxpool2d argmax", Mul(out, sizeof(int32_t))});
          } else if constexpr (std::is_same_v<C, DropoutConfig>) {
            plan->needs.push_back({layer, "dropout mask", Mul(out, kFloat)});
          } else if constexpr (std::is_base_of_v<BatchNormFields, C>) {
            // Running and saved statistics; without affine, a fixed gamma and beta and their
            // discarded gradients too.
            plan->needs.push_back({layer,
                                   absl::StrCat(LayerTypeName(model.layers[i]), " statistics"),
                                   Mul(Mul(c.affine ? 4 : 8, c.num_features), kFloat)});
            // On the model's input no input gradient is wanted, but cuDNN (which the CUDA
            // backend calls where a channel has more than one value per sample) writes one: it
            // gets scratch of the input's size at the training batch.
            const int64_t per_channel = NumElements(shapes[0]) / c.num_features;
            if (target.device == DeviceKind::kCuda && graph.inputs[i][0] == 0 && per_channel > 1) {
              plan->needs.push_back(
                  {layer, absl::StrCat(LayerTypeName(model.layers[i]), " input-gradient scratch"),
                   Mul(Mul(NumElements(shapes[0]), train_batch), kFloat)});
            }
          } else if constexpr (std::is_same_v<C, LayerNormConfig>) {
            // Each position's mean and rstd.
            const int64_t rows = NumElements(shapes[graph.inputs[i][0]]) / c.normalized_shape;
            plan->needs.push_back(
                {layer, "layernorm statistics", Mul(Mul(2 * rows, capacity), kFloat)});
          } else if constexpr (std::is_same_v<C, CausalSelfAttentionConfig>) {
            // q, k, v split out, the B x H x T x T weights and their gradient, the heads.
            const int64_t t = shapes[graph.inputs[i][0]][0];
            plan->needs.push_back({layer, "causal_self_attention buffers",
                                   Mul(Mul(AttentionSavedElements(c, t), capacity), kFloat)});
          } else if constexpr (std::is_same_v<C, Conv2dConfig>) {
            const int64_t bytes = LayerConvWorkspaceBytes(c, shapes[graph.inputs[i][0]],
                                                          train_batch, eval_batch, target);
            if (bytes > workspace.bytes) workspace = {layer, "conv2d workspace", bytes};
          }
        },
        model.layers[i]);
  }
  if (workspace.bytes > 0) plan->needs.push_back(workspace);
  if (bf16_copies.bytes > 0) plan->needs.push_back(bf16_copies);
  int64_t scratch = 0;
  for (int64_t elements : GradientScratchElements(graph, shapes)) {
    scratch = Add(scratch, Mul(Mul(elements, capacity), kFloat));
  }
  if (scratch > 0) plan->needs.push_back({-1, "gradient sums of shared outputs", scratch});
  return absl::OkStatus();
}

}  // namespace

std::string MemoryNeed::Describe() const {
  return layer >= 0 ? absl::StrCat("layer ", layer, " ", what, ": ", FormatBytes(bytes))
                    : absl::StrCat(what, ": ", FormatBytes(bytes));
}

int64_t MemoryPlan::total_bytes() const {
  int64_t total = 0;
  for (const MemoryNeed& n : needs) total = Add(total, n.bytes);
  return total;
}

const MemoryNeed& MemoryPlan::largest() const {
  return *std::max_element(needs.begin(), needs.end(),
                           [](const auto& a, const auto& b) { return a.bytes < b.bytes; });
}

absl::StatusOr<MemoryPlan> PlanTrainingMemory(const TrainConfig& config, int64_t train_samples,
                                              int64_t test_samples, const MemoryTarget& target) {
  KILN_ASSIGN_OR_RETURN(std::vector<Shape> shapes, InferShapes(config.model));
  const int64_t params = CountParameters(config.model);
  const int64_t batch = config.batch_size;
  // A token run (max_iters > 0) evaluates in batches of its own size, and its samples are tokens
  // of memory-mapped shards: page cache, not the job's memory.
  const bool token_run = config.max_iters > 0;
  const int64_t eval_batch = test_samples <= 0 ? 0
                             : token_run       ? batch
                                               : std::min<int64_t>(kEvalBatchSize, test_samples);
  // The trainer sizes its batch buffers for the larger of a training and an evaluation batch.
  const int64_t capacity = token_run ? batch : std::max<int64_t>(batch, kEvalBatchSize);
  const int64_t input = NumElements(config.model.input_shape);
  const int64_t classes = NumElements(shapes.back());

  MemoryPlan plan;
  plan.needs.push_back({-1, "parameters and gradients", Mul(2 * params, kFloat)});
  int64_t slots = 0;  // optimizer state per parameter
  if (config.optimizer.kind == OptimizerConfig::Kind::kSgd) {
    slots = config.optimizer.momentum != 0 ? 1 : 0;
  } else {
    slots = 2;  // Adam's first and second moments
  }
  plan.needs.push_back({-1, "optimizer state", Mul(Mul(slots, params), kFloat)});
  KILN_RETURN_IF_ERROR(AddLayerNeeds(config.model, shapes, std::max(batch, eval_batch), batch,
                                     eval_batch, target, &plan));
  // Batch inputs, labels, logit gradients and the loss's one-hot targets.
  plan.needs.push_back(
      {-1, "batch buffers",
       Mul(Add(Add(Mul(capacity, input), Mul(2 * capacity, classes)), capacity), kFloat)});
  // The dataset on the host (pixels, int32 labels) and again on the device (plus the shuffle
  // permutation and evaluation index); on the CPU both copies are in main memory.
  if (token_run) {
    // One batch's windows staged on the host (inputs and targets) before their copy.
    plan.needs.push_back({-1, "token windows", Mul(2 * batch, Mul(input, sizeof(int32_t)))});
    return plan;
  }
  const int64_t samples = Add(train_samples, test_samples);
  const int64_t dataset = Add(Mul(samples, input), Mul(samples, sizeof(int32_t)));
  plan.needs.push_back({-1, "dataset", Add(Mul(2, dataset), Mul(2 * samples, sizeof(int32_t)))});
  if (config.augment.enabled()) {
    // An epoch's crop-and-flip decisions, drawn on the host and copied to the device.
    plan.needs.push_back({-1, "augmentation decisions", Mul(2 * train_samples, sizeof(CropFlip))});
  }
  return plan;
}

absl::StatusOr<MemoryPlan> PlanInferenceMemory(const ModelConfig& model, int max_batch,
                                               const MemoryTarget& target) {
  KILN_ASSIGN_OR_RETURN(std::vector<Shape> shapes, InferShapes(model));
  const int64_t params = CountParameters(model);
  const int64_t input = NumElements(model.input_shape);
  const int64_t classes = NumElements(shapes.back());
  MemoryPlan plan;
  // Parameters are built with their gradients, as for training.
  plan.needs.push_back({-1, "parameters and gradients", Mul(2 * params, kFloat)});
  KILN_RETURN_IF_ERROR(
      AddLayerNeeds(model, shapes, max_batch, /*train_batch=*/0, max_batch, target, &plan));
  // The session's device buffers (uint8 and float inputs, the model input, probabilities,
  // classes, index) and the batcher's host staging of the same.
  const int64_t per_sample = Add(Mul(input, 1 + kFloat + kFloat), Mul(classes, kFloat) + 8);
  plan.needs.push_back({-1, "request buffers", Mul(Mul(2, per_sample), max_batch)});
  return plan;
}

}  // namespace kiln
