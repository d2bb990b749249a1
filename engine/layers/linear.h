// Linear: y = x W^T + b, with W (out_features, in_features) as in torch.nn.Linear.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/layers/layer.h"
#include "engine/model_config.h"
#include "engine/rng.h"

namespace kiln {

// Output (out_features) for an input of in_features elements (any shape), as a flattened
// sample; otherwise, for an input of rank >= 2 whose last dimension is in_features, the input's
// shape with that last dimension out_features: a Linear over every position of a (T, d)
// sequence (rows = batch * T), as torch.nn.Linear. A (1, in_features) input is read the first way.
absl::StatusOr<Shape> OutputShape(const LinearConfig& c, const Shape& input);
int64_t ParameterCount(const LinearConfig& c);
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const LinearConfig& c, const LayerContext& ctx);

class Linear final : public Layer {
 public:
  static absl::StatusOr<std::unique_ptr<Layer>> Create(const LinearConfig& config, Backend* backend,
                                                       const Shape& input, Rng* rng);
  const char* type() const override { return "linear"; }
  // Applied per position when its output is (T, ..., out_features), not to the whole sample.
  Incremental incremental() const override {
    return output_shape_.size() >= 2 ? Incremental::kPositionWise : Incremental::kUnsupported;
  }
  absl::Status Forward(const Tensor& x, Tensor* y, Mode mode) override;
  absl::Status Backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;
  std::vector<Parameter*> parameters() override;
  // A tied weight's tensors: the embedding's value and grad, shared (weight_ keeps its name).
  void BindTiedWeight(const Parameter& table) {
    weight_.value = table.value;
    weight_.grad = table.grad;
  }

 private:
  Linear(const LinearConfig& config, Backend* backend, const Shape& input, Shape output)
      : Layer(backend, input, std::move(output)), config_(config) {}
  LinearConfig config_;
  Parameter weight_, bias_;
};

}  // namespace kiln
