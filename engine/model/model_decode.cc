// Model's incremental decoding: a DecodeState per stream, and ForwardAt over a sequence's new
// positions through each layer's ForwardAt (Layer::incremental).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/model/model.h"
#include "engine/model/sequence_model.h"

namespace kiln {

namespace {

// (1, t, rest...) for a per-sample (T, rest...).
Shape NewPositions(const Shape& per_sample, int64_t t) {
  Shape s = per_sample;
  s[0] = t;
  s.insert(s.begin(), 1);
  return s;
}

}  // namespace

absl::Status Model::CheckIncremental() const {
  KILN_RETURN_IF_ERROR(SequenceModelShapeOf(config_).status());
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i]->incremental() == Incremental::kUnsupported || fused_[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat(NodeLabel(config_, i), ": ", layers_[i]->type(),
                       " cannot run over a sequence's new positions alone, so this model is not "
                       "a causal sequence model that can generate or decode incrementally"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DecodeState>> Model::NewDecodeState() {
  KILN_RETURN_IF_ERROR(CheckIncremental());
  KILN_ASSIGN_OR_RETURN(SequenceModelShape shape, SequenceModelShapeOf(config_));
  auto state = std::unique_ptr<DecodeState>(new DecodeState());
  state->model_ = this;
  state->capacity_ = shape.context;
  state->caches_.resize(layers_.size());
  state->activations_.resize(shapes_.size());
  for (size_t v = 1; v < shapes_.size(); ++v) {
    KILN_ASSIGN_OR_RETURN(state->activations_[v],
                          backend_->Allocate(DType::kF32, NewPositions(shapes_[v], shape.context)));
  }
  return state;
}

absl::StatusOr<const Tensor*> Model::ForwardAt(const Tensor& ids, DecodeState* state) {
  if (state == nullptr || state->model_ != this) {
    return absl::InvalidArgumentError("ForwardAt: the decode state was not made by this model");
  }
  const int64_t t = ids.numel(), offset = state->length_;
  const bool one_row = ids.rank() == 1 || (ids.rank() == 2 && ids.dim(0) == 1);
  if (ids.dtype() != DType::kI32 || !one_row || t < 1) {
    return absl::InvalidArgumentError(absl::StrCat("ForwardAt takes (1, t) int32 token ids, got ",
                                                   DTypeName(ids.dtype()), " ",
                                                   ShapeString(ids.shape())));
  }
  if (offset + t > state->capacity_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ForwardAt: ", t, " new positions after ", offset, " exceed the model's sequence length ",
        state->capacity_, " (Reset the state and run a cropped context)"));
  }
  for (size_t v = 1; v < shapes_.size(); ++v) {
    state->activations_[v].Reshape(NewPositions(shapes_[v], t));
  }
  std::vector<const Tensor*> xs;
  for (size_t i = 0; i < layers_.size(); ++i) {
    xs.clear();
    for (int v : graph_.inputs[i]) xs.push_back(v == 0 ? &ids : &state->activations_[v]);
    absl::Status s =
        layers_[i]->ForwardAt(xs, offset, &state->caches_[i], &state->activations_[i + 1]);
    if (!s.ok()) {
      state->Reset();  // the caches before this layer took the new positions; those after did not
      return absl::Status(s.code(), absl::StrCat(NodeLabel(config_, i), ": ", s.message()));
    }
  }
  state->length_ = offset + t;
  return &state->activations_.back();
}

}  // namespace kiln
