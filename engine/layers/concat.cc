#include "engine/layers/concat.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kiln {

namespace {
constexpr double kMaxConcatElements = double{1 << 30};
}  // namespace

absl::StatusOr<Shape> OutputShape(const ConcatConfig&, const std::vector<NodeInput>& inputs) {
  if (inputs.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("concat needs at least 2 inputs, got ", inputs.size()));
  }
  Shape out = inputs[0].shape;
  for (size_t k = 1; k < inputs.size(); ++k) {
    const Shape& s = inputs[k].shape;
    if (s.size() != out.size() || !std::equal(s.begin() + 1, s.end(), out.begin() + 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "inputs ", inputs[0].name, " is ", ShapeString(inputs[0].shape), " but ", inputs[k].name,
          " is ", ShapeString(s), "; concat needs all but the first dimension equal"));
    }
    out[0] += s[0];
  }
  // Chained concats double a sample's size each time: bound it before anything multiplies it.
  double elements = 1;
  for (int64_t d : out) elements *= static_cast<double>(d);
  if (elements > kMaxConcatElements) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output of ", elements, " values per sample is over the limit of ", kMaxConcatElements));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const ConcatConfig&, const LayerContext& ctx) {
  return std::make_unique<Concat>(ctx.backend, ctx.inputs, ctx.output);
}

absl::Status Concat::Forward(const Tensor&, Tensor*, Mode) {
  return absl::FailedPreconditionError("concat takes several inputs: call ForwardInputs");
}

absl::Status Concat::Backward(const Tensor&, const Tensor&, const Tensor&, Tensor*) {
  return absl::FailedPreconditionError("concat takes several inputs: call BackwardInputs");
}

// y is (batch, out) per sample flattened; input k is (batch, its elements) at column offset.
absl::Status Concat::ForwardInputs(const std::vector<const Tensor*>& xs, Tensor* y, Mode) {
  if (xs.size() != inputs_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("concat was built for ", inputs_.size(), " inputs, got ", xs.size()));
  }
  const int64_t batch = y->dim(0), out = NumElements(output_shape_);
  int64_t offset = 0;
  for (size_t k = 0; k < xs.size(); ++k) {
    const int64_t cols = NumElements(inputs_[k]);
    KILN_RETURN_IF_ERROR(backend_->Copy2D(batch, cols, xs[k]->f32(), cols, y->f32() + offset, out));
    offset += cols;
  }
  return absl::OkStatus();
}

absl::Status Concat::BackwardInputs(const std::vector<const Tensor*>&, const Tensor&,
                                    const Tensor& dy, const std::vector<Tensor*>& dxs) {
  const int64_t batch = dy.dim(0), out = NumElements(output_shape_);
  int64_t offset = 0;
  for (size_t k = 0; k < dxs.size() && k < inputs_.size(); ++k) {
    const int64_t cols = NumElements(inputs_[k]);
    if (dxs[k] != nullptr) {
      KILN_RETURN_IF_ERROR(
          backend_->Copy2D(batch, cols, dy.f32() + offset, out, dxs[k]->f32(), cols));
    }
    offset += cols;
  }
  return absl::OkStatus();
}

}  // namespace kiln
