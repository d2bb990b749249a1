// Concat: 2+ inputs joined along their first per-sample dimension: the channels of CxHxW images
// (torch.cat(dim=1)), the features of vectors.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/layers/layer.h"
#include "engine/model/model_config.h"

namespace kiln {

// The inputs' first dimensions summed; an error naming two inputs whose other dimensions (or
// ranks) differ.
absl::StatusOr<Shape> OutputShape(const ConcatConfig& c, const std::vector<NodeInput>& inputs);
inline int64_t ParameterCount(const ConcatConfig&) { return 0; }
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const ConcatConfig& c, const LayerContext& ctx);

class Concat final : public Layer {
 public:
  Concat(Backend* backend, std::vector<Shape> inputs, const Shape& output)
      : Layer(backend, inputs[0], output), inputs_(std::move(inputs)) {}
  const char* type() const override { return "concat"; }
  // A concat has several inputs: only ForwardInputs and BackwardInputs apply.
  absl::Status Forward(const Tensor& x, Tensor* y, Mode mode) override;
  absl::Status Backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;
  // Each sample of y is every input's sample, one after the other.
  absl::Status ForwardInputs(const std::vector<const Tensor*>& xs, Tensor* y, Mode mode) override;
  // Each input's gradient is its slice of dy.
  absl::Status BackwardInputs(const std::vector<const Tensor*>& xs, const Tensor& y,
                              const Tensor& dy, const std::vector<Tensor*>& dxs) override;

 private:
  std::vector<Shape> inputs_;  // per sample
};

}  // namespace kiln
