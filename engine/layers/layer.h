// The contract every layer keeps: built from its config for a known per-sample input shape, then
// forward and backward over batches, written once against the Backend interface.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/backend.h"
#include "engine/kv_cache.h"
#include "engine/rng.h"
#include "engine/tensor.h"

namespace kiln {

enum class Mode { kTrain, kEval };

// How a layer of a sequence model runs over only the new positions of a sequence (ForwardAt,
// Model::ForwardAt), the rest having run before.
enum class Incremental {
  kUnsupported,   // not a layer over positions (conv2d, flatten, a linear over the whole sample)
  kPositionWise,  // each position's output reads only that position: Forward over the new ones
  kOwn,           // reads other positions or knows its own: overrides ForwardAt
};

// One input of a node as its shape rule sees it: the name it was given by ("layer1.0.bn2",
// "input") and its per-sample shape.
struct NodeInput {
  std::string name;
  Shape shape;
};

// A learnable tensor and its gradient (same shape), on the layer's backend.
struct Parameter {
  std::string name;  // "weight" or "bias"; the model prefixes the layer index ("3.weight").
  Tensor value;
  Tensor grad;
};

// Non-learnable state kept with the weights (PyTorch's buffers: running statistics, counters).
// Checkpoints save and restore it under the same names as parameters ("3.running_mean");
// optimizers and ZeroGrad never touch it.
enum class BufferKind {
  kF32,       // `value`, a float tensor on the layer's backend
  kI64Count,  // `count`, a host int64 saved as a 0-dim I64 tensor ("num_batches_tracked")
};
struct StateBuffer {
  std::string name;  // "running_mean"; the model prefixes the layer as for parameters
  BufferKind kind = BufferKind::kF32;
  Tensor value;
  int64_t count = 0;
};

// What building a layer needs besides its config. Each layer's files define, for its config C:
//   absl::StatusOr<Shape> OutputShape(const C&, const Shape& input)   its shape rule
//   int64_t ParameterCount(const C&)                                   its learnable values
//   absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const C&, const LayerContext&)
// and engine/layers/layers.h gathers them for the model, which dispatches on the config's type.
//
// Layers over several inputs (add, concat) instead define
//   absl::StatusOr<Shape> OutputShape(const C&, const std::vector<NodeInput>& inputs)
// and override ForwardInputs and BackwardInputs.
struct LayerContext {
  Backend* backend = nullptr;
  Shape input, output;                   // per sample; output is what OutputShape gave
  std::vector<Shape> inputs;             // every input's shape (input is inputs[0])
  Rng* rng = nullptr;                    // parameter initialisation, drawn in layer order
  uint64_t stream_seed = 0;              // the layer's own random stream (dropout)
  Activation fused = Activation::kNone;  // an activation fused into the layer's output
  // A conv2d's fused max pooling (Backend::Conv2dMaxPoolForward): its kernel size, stride the
  // same and no padding; 0 for none. The layer's output is then the pooled one.
  int64_t fused_max_pool = 0;
  // How the model keeps the layer's first input and its output, where they are images
  // (Backend::TakesNchw16c): a conv2d's two may differ; batch norm and average pooling run in
  // their input's.
  ImageLayout input_layout = ImageLayout::kNchw, output_layout = ImageLayout::kNchw;
};

class Layer {
 public:
  Layer(Backend* backend, Shape input_shape, Shape output_shape)
      : backend_(backend),
        input_shape_(std::move(input_shape)),
        output_shape_(std::move(output_shape)) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  virtual const char* type() const = 0;
  // Per-sample shapes, without the batch dimension.
  const Shape& input_shape() const { return input_shape_; }
  const Shape& output_shape() const { return output_shape_; }
  // What its input holds: floats, or int32 token ids (an embedding).
  virtual DType input_dtype() const { return DType::kF32; }

  // y = f(x). x is (batch, input_shape...); y is preallocated as (batch, output_shape...).
  virtual absl::Status Forward(const Tensor& x, Tensor* y, Mode mode) = 0;
  // From dy (shaped like y), accumulates parameter gradients and, when dx is not null,
  // overwrites dx (shaped like x). x and y are the tensors of the last Forward in kTrain mode.
  virtual absl::Status Backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) = 0;

  // What the model calls, with a node's inputs in order: one for most layers, where these are
  // Forward and Backward; add and concat override them. dxs[k] (null where not wanted) is
  // overwritten with the gradient of xs[k].
  virtual absl::Status ForwardInputs(const std::vector<const Tensor*>& xs, Tensor* y, Mode mode) {
    if (xs.size() != 1) return InputCountError(xs.size());
    return Forward(*xs[0], y, mode);
  }
  virtual absl::Status BackwardInputs(const std::vector<const Tensor*>& xs, const Tensor& y,
                                      const Tensor& dy, const std::vector<Tensor*>& dxs) {
    if (xs.size() != 1 || dxs.size() != 1) return InputCountError(xs.size());
    return Backward(*xs[0], y, dy, dxs[0]);
  }

  // Incremental decoding of one sequence (batch 1): xs[k] hold only the t new positions
  // position_offset..position_offset+t-1, (1, t, ...) where the layer's shapes are (T, ...), and y
  // is (1, t, ...) too. `cache` is this layer's, for this sequence (a causal attention appends the
  // new keys and values to it and attends over all of them); other layers ignore it. Eval mode.
  // A kPositionWise layer runs ForwardInputs over the new positions; kUnsupported refuses.
  virtual Incremental incremental() const { return Incremental::kUnsupported; }
  virtual absl::Status ForwardAt(const std::vector<const Tensor*>& xs, int64_t /*position_offset*/,
                                 KvCache* /*cache*/, Tensor* y) {
    if (incremental() != Incremental::kPositionWise) {
      return absl::UnimplementedError(
          absl::StrCat(type(), " cannot run over a sequence's new positions alone"));
    }
    return ForwardInputs(xs, y, Mode::kEval);
  }

  virtual std::vector<Parameter*> parameters() { return {}; }
  virtual std::vector<StateBuffer*> buffers() { return {}; }

  // Layers that draw random numbers (dropout) keep their position in their stream, which
  // checkpoints record so that a resumed run draws what the uninterrupted one would have.
  virtual bool has_random_stream() const { return false; }
  virtual uint64_t random_offset() const { return 0; }
  virtual void set_random_offset(uint64_t) {}

 protected:
  absl::Status InputCountError(size_t got) const {
    return absl::InvalidArgumentError(absl::StrCat(type(), " takes one input, got ", got));
  }

  Backend* backend_;
  Shape input_shape_, output_shape_;
};

}  // namespace kiln
