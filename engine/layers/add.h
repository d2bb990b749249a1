// Add: y = x0 + x1 + ..., element-wise over 2+ inputs of one shape (a residual connection).
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/layers/layer.h"
#include "engine/model/model_config.h"

namespace kiln {

// The inputs' common shape; an error naming two inputs whose shapes differ.
absl::StatusOr<Shape> OutputShape(const AddConfig& c, const std::vector<NodeInput>& inputs);
inline int64_t ParameterCount(const AddConfig&) { return 0; }
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const AddConfig& c, const LayerContext& ctx);

class Add final : public Layer {
 public:
  Add(Backend* backend, const Shape& shape, size_t num_inputs)
      : Layer(backend, shape, shape), num_inputs_(num_inputs) {}
  const char* type() const override { return "add"; }
  // Element-wise: each position on its own.
  Incremental incremental() const override { return Incremental::kPositionWise; }
  // An add has several inputs: only ForwardInputs and BackwardInputs apply.
  absl::Status Forward(const Tensor& x, Tensor* y, Mode mode) override;
  absl::Status Backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;
  absl::Status ForwardInputs(const std::vector<const Tensor*>& xs, Tensor* y, Mode mode) override;
  // Every input's gradient is dy.
  absl::Status BackwardInputs(const std::vector<const Tensor*>& xs, const Tensor& y,
                              const Tensor& dy, const std::vector<Tensor*>& dxs) override;

 private:
  size_t num_inputs_;
};

}  // namespace kiln
