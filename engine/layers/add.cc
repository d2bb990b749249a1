#include "engine/layers/add.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kiln {

absl::StatusOr<Shape> OutputShape(const AddConfig&, const std::vector<NodeInput>& inputs) {
  if (inputs.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("add needs at least 2 inputs, got ", inputs.size()));
  }
  for (size_t k = 1; k < inputs.size(); ++k) {
    if (inputs[k].shape != inputs[0].shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("inputs ", inputs[0].name, " is ", ShapeString(inputs[0].shape), " but ",
                       inputs[k].name, " is ", ShapeString(inputs[k].shape)));
    }
  }
  return inputs[0].shape;
}

absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const AddConfig&, const LayerContext& ctx) {
  return std::make_unique<Add>(ctx.backend, ctx.output, ctx.inputs.size());
}

absl::Status Add::Forward(const Tensor&, Tensor*, Mode) {
  return absl::FailedPreconditionError("add takes several inputs: call ForwardInputs");
}

absl::Status Add::Backward(const Tensor&, const Tensor&, const Tensor&, Tensor*) {
  return absl::FailedPreconditionError("add takes several inputs: call BackwardInputs");
}

absl::Status Add::ForwardInputs(const std::vector<const Tensor*>& xs, Tensor* y, Mode) {
  if (xs.size() != num_inputs_) {
    return absl::InvalidArgumentError(
        absl::StrCat("add was built for ", num_inputs_, " inputs, got ", xs.size()));
  }
  const int64_t n = y->numel();
  // Summed left to right, so every backend adds in the same order.
  KILN_RETURN_IF_ERROR(backend_->Add(n, xs[0]->f32(), xs[1]->f32(), y->f32()));
  for (size_t k = 2; k < xs.size(); ++k) {
    KILN_RETURN_IF_ERROR(backend_->Add(n, y->f32(), xs[k]->f32(), y->f32()));
  }
  return absl::OkStatus();
}

absl::Status Add::BackwardInputs(const std::vector<const Tensor*>&, const Tensor&, const Tensor& dy,
                                 const std::vector<Tensor*>& dxs) {
  for (Tensor* dx : dxs) {
    // An input whose gradient is dy's own tensor (Model::grad_alias_) has it already.
    if (dx != nullptr && dx->raw() != dy.raw()) {
      KILN_RETURN_IF_ERROR(backend_->Copy(dy, dx, dy.bytes()));
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln
