// A model built from a ModelConfig, a Sequential chain or a DAG of named nodes: shape-checked at
// build, then forward (in node order, which is topological) and backward over batches with
// activations kept for the backward pass.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/decode_state.h"
#include "engine/layers/layer.h"
#include "engine/model/model_config.h"
#include "engine/model/model_graph.h"
#include "engine/rng.h"

namespace kiln {

// Per-sample shapes: [0] the input, [i+1] the output of layer i. Fails before anything is
// allocated, naming the layer and both shapes ("layer 6 linear: in_features 1024 but input is
// 64x5x5 = 1600", "node layer1.0.add: inputs layer1.0.conv2 is 64x16x16 but layer1.0.shortcut is
// 32x16x16"), or the graph's problem (ResolveGraph). Usable without a backend, e.g. to validate a
// submitted spec.
absl::StatusOr<std::vector<Shape>> InferShapes(const ModelConfig& config);

// Number of learnable scalars of a config (after InferShapes succeeded).
int64_t CountParameters(const ModelConfig& config);

// The part of a model that labelled data disagrees with (CheckModelFitsData).
enum class ModelPart { kInputShape, kOutputs };

// The one rule for whether labelled samples fit a classifier, used by SubmitJob and the trainer:
// a sample holds as many values as the model's input, and the model's output is flat with an
// output for every label. `which` names the data in messages ("training" gives "model input is
// 100 = 100 values but training samples are 8x8 = 64"). InvalidArgument; `culprit`, when given,
// receives the part of the model at odds. Errors of InferShapes pass through.
absl::Status CheckModelFitsData(const ModelConfig& config, const Shape& sample_shape,
                                int64_t num_classes, std::string_view which,
                                ModelPart* culprit = nullptr);

// Batch normalisation in training needs more than one value per channel (PyTorch raises
// otherwise), so `samples` split into batches of `batch_size` must not leave a batch of one sample
// where a batchnorm layer's channel holds one value per sample (batchnorm1d over features).
// InvalidArgument naming the layer; used by Trainer::Create, CheckDataParallelBatches and by kilnd
// before queueing a job.
absl::Status CheckBatchNormBatches(const ModelConfig& model, int64_t batch_size, int64_t samples);

struct NamedParameter {
  std::string name;  // PyTorch state_dict key, StateDictName's: "3.weight", "layer1.0.conv1.weight"
  Parameter* param;
};

struct NamedBuffer {
  std::string name;  // PyTorch state_dict key: StateDictName's: "3.running_mean"
  StateBuffer* buffer;
};

// kFuse runs a ReLU that reads a conv2d's output inside the convolution when nothing else reads
// that output (same results, one pass less over memory each way), and likewise a max pooling of
// non-overlapping windows after it where the backend can (the CPU's keeps the convolution's
// output in its blocked layout then); on a backend that takes nChw16c it keeps images in that
// layout between the layers that take it, and runs a ReLU inside the batchnorm2d before it
// there (Backend::FusesBatchNormRelu). kNone keeps every layer separate and every image NCHW.
enum class Fusion { kFuse, kNone };

// Wall time per layer of the training passes (kTrain forwards and backwards) made while attached
// to a model (set_layer_times). The backend is synchronised after every layer so asynchronous
// devices are timed too; that costs a little, so it is for profiling, not for every run. A fused
// layer's time is its host's.
struct LayerTimes {
  std::vector<double> forward_s, backward_s;  // indexed by layer
  int64_t forward_calls = 0, backward_calls = 0;
};

class Model {
 public:
  // Builds every layer on `backend` and initialises parameters as PyTorch's defaults do
  // (kaiming-uniform with a=sqrt(5), bias uniform in +-1/sqrt(fan_in)) from `seed`.
  static absl::StatusOr<std::unique_ptr<Model>> Build(const ModelConfig& config, Backend* backend,
                                                      uint64_t seed, Fusion fusion = Fusion::kFuse);

  // Runs all layers on x (batch, input_shape...). The returned tensor is owned by the model and
  // valid until the next Forward.
  absl::StatusOr<const Tensor*> Forward(const Tensor& x, Mode mode);
  // Backpropagates dout (shaped like the last output) after a kTrain Forward; parameter
  // gradients accumulate. The gradients of an output read by several nodes are summed. The input
  // gradient is not computed.
  absl::Status Backward(const Tensor& dout);
  absl::Status ZeroGrad();

  // Incremental decoding (engine/model/model_decode.cc): a sequence run a few new positions at a time,
  // each attention layer keeping the earlier positions' keys and values, so a new token costs one
  // position, not the whole prefix. NewDecodeState makes one stream's state; it fails, naming
  // what is wrong, unless this is a sequence model (SequenceModelShapeOf) whose every layer runs
  // incrementally (Layer::incremental).
  absl::StatusOr<std::unique_ptr<DecodeState>> NewDecodeState();
  // NewDecodeState's check alone: a sequence model whose every layer runs incrementally, which
  // also makes it causal (no position reads a later one). InvalidArgument naming the layer.
  absl::Status CheckIncremental() const;
  // Runs the new positions state->length().. of the state's sequence: `ids` (1, t) or (t) int32
  // on this backend, t >= 1, length + t <= T. Returns their (1, t, vocab) logits (eval mode),
  // owned by the state and valid until its next call: the same as Forward's rows over the whole
  // sequence. Refused arguments leave the state as it was; a failure while running Resets it.
  // Layers keep per-call statistics (layernorm), so one model runs one ForwardAt or Forward at a
  // time.
  absl::StatusOr<const Tensor*> ForwardAt(const Tensor& ids, DecodeState* state);

  const ModelConfig& config() const { return config_; }
  const Shape& output_shape() const { return shapes_.back(); }
  // Each learnable tensor once: a weight tied to an embedding (LinearConfig::tie_weight) under the
  // embedding's name only.
  std::vector<NamedParameter> parameters();
  // Non-learnable state (running statistics), named as parameters are; in layer order.
  std::vector<NamedBuffer> buffers();
  int64_t parameter_count() const;
  // Positions in the dropout layers' random streams, in layer order (for exact resume).
  std::vector<uint64_t> random_offsets() const;
  absl::Status set_random_offsets(const std::vector<uint64_t>& offsets);
  Backend* backend() const { return backend_; }
  size_t num_layers() const { return layers_.size(); }
  const char* layer_type(size_t i) const { return layers_[i]->type(); }
  // Node i's name ("layer1.0.conv1", or "3" when unnamed).
  const std::string& node_name(size_t i) const { return graph_.names[i]; }
  bool layer_fused(size_t i) const { return fused_[i]; }
  // How layer i's output is kept (Nchw16cValues in model.cc).
  ImageLayout output_layout(size_t i) const {
    return nchw16c_[i + 1] ? ImageLayout::kNchw16c : ImageLayout::kNchw;
  }
  // Whether layer i's output gradient is the tensor of the add that alone reads that output
  // (grad_alias_), not a copy of it.
  bool output_grad_shared(size_t i) const { return grad_alias_[i + 1] >= 0; }
  // Starts (or with nullptr stops) adding each layer's forward and backward time to `times`.
  void set_layer_times(LayerTimes* times);

 private:
  Model(const ModelConfig& config, Backend* backend) : config_(config), backend_(backend) {}
  // Which layers run fused into the one before them (fused_, fused_into_; a conv2d's max pooling
  // kernel in max_pool_of) and which values stay in nChw16c (nchw16c_); none under kNone.
  void PlanFusion(Fusion fusion, std::vector<int64_t>* max_pool_of);
  // Which values take an add's output gradient as their own (grad_alias_).
  void PlanGradientAliases();
  absl::Status EnsureActivations(int64_t batch);
  // d loss / d (output of layer i): past the fused layers that alias that output.
  const Tensor& OutputGrad(size_t i, const Tensor& dout) const;
  // The last value of the chain of fused layers that starts at value v (v itself if none): what
  // activations_[v] holds, and its shape.
  size_t ChainEnd(size_t v) const;

  ModelConfig config_;
  Backend* backend_;
  ModelGraph graph_;
  std::vector<Shape> shapes_;
  std::vector<std::unique_ptr<Layer>> layers_;
  // fused_[i]: layer i (a ReLU, a max pooling) runs inside the conv2d or batchnorm2d whose output
  // it reads (through a fused ReLU for the pooling), the only reader; its output aliases that
  // layer's, which holds the last fused layer's output.
  std::vector<bool> fused_;
  // fused_into_[v]: the layer fused onto value v (its only reader), or -1.
  std::vector<int> fused_into_;
  // nchw16c_[v]: value v (and its gradient) is kept in ImageLayout::kNchw16c.
  std::vector<bool> nchw16c_;
  // activations_[0] is unused (the input is the caller's); [i+1] the output of layer i.
  std::vector<Tensor> activations_;
  std::vector<Tensor> grads_;  // grads_[v] is d loss / d activations_[v]
  // grad_alias_[v]: the value whose gradient tensor is v's too, or -1. An add passes its output's
  // gradient unchanged to every input, so an input only the add reads shares that tensor instead
  // of taking a copy (two 8 MB copies a step in the ResNet example's first block). Safe because
  // the tensor's other writers, the add's readers, run their backward before the add's, and no
  // backward writes the gradient it reads.
  std::vector<int> grad_alias_;
  // scratch_[k]: where input slot k of a node writes a gradient that is then summed into its
  // value's (ModelGraph::sums_gradient).
  std::vector<Tensor> scratch_;
  std::vector<int64_t> scratch_elements_;  // per sample, GradientScratchElements
  const Tensor* input_ = nullptr;
  int64_t capacity_ = 0;
  LayerTimes* layer_times_ = nullptr;
};

}  // namespace kiln
