// Linear: y = x W^T + b, with W (out_features, in_features) as in torch.nn.Linear.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/layers/layer.h"
#include "engine/model/model_config.h"
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
  // A tied weight is the embedding's Parameter itself, read at every pass, so that whatever
  // later replaces its tensors (data-parallel training moves every gradient into one buffer)
  // this layer uses too. The layer then lists its bias only: the table is the embedding's.
  void BindTiedWeight(Parameter* table) { tied_ = table; }

 private:
  Linear(const LinearConfig& config, Backend* backend, const Shape& input, Shape output)
      : Layer(backend, input, std::move(output)), config_(config) {}
  const Parameter& weight() const { return tied_ != nullptr ? *tied_ : weight_; }

  LinearConfig config_;
  Parameter weight_, bias_;
  Parameter* tied_ = nullptr;  // the embedding's table when config_.tie_weight is set
};

}  // namespace kiln
