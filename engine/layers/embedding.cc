#include "engine/layers/embedding.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/layers/layer_rules.h"
#include "engine/layers/parameter_init.h"

namespace kiln {

namespace {

constexpr float kInitStd = 0.02f;  // GPT-2's, nanoGPT's _init_weights

}  // namespace

absl::StatusOr<Shape> OutputShape(const EmbeddingConfig& c, const Shape& in) {
  KILN_RETURN_IF_ERROR(CheckPositive("num_embeddings", c.num_embeddings));
  KILN_RETURN_IF_ERROR(CheckPositive("embedding_dim", c.embedding_dim));
  if (in.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("needs T token ids per sample but input is ", ShapeString(in)));
  }
  return Shape{in[0], c.embedding_dim};
}

absl::StatusOr<Shape> OutputShape(const PositionEmbeddingConfig& c, const Shape& in) {
  KILN_RETURN_IF_ERROR(CheckPositive("block_size", c.block_size));
  KILN_RETURN_IF_ERROR(CheckPositive("embedding_dim", c.embedding_dim));
  if (in.size() != 2 || in[1] != c.embedding_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("needs a (T, ", c.embedding_dim, ") input but input is ", ShapeString(in)));
  }
  if (in[0] > c.block_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence length ", in[0], " exceeds block_size ", c.block_size));
  }
  return in;
}

absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const EmbeddingConfig& c,
                                                 const LayerContext& ctx) {
  return Embedding::Create(c, ctx.backend, ctx.input, ctx.rng);
}

absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const PositionEmbeddingConfig& c,
                                                 const LayerContext& ctx) {
  return PositionEmbedding::Create(c, ctx.backend, ctx.input, ctx.rng);
}

absl::StatusOr<std::unique_ptr<Layer>> Embedding::Create(const EmbeddingConfig& c, Backend* backend,
                                                         const Shape& input, Rng* rng) {
  KILN_ASSIGN_OR_RETURN(Shape output, OutputShape(c, input));
  auto layer = std::unique_ptr<Embedding>(new Embedding(c, backend, input, output));
  KILN_RETURN_IF_ERROR(InitNormalParameter(backend, "weight", {c.num_embeddings, c.embedding_dim},
                                           kInitStd, rng, &layer->weight_));
  return std::unique_ptr<Layer>(std::move(layer));
}

absl::Status Embedding::Forward(const Tensor& x, Tensor* y, Mode) {
  if (x.dtype() != DType::kI32) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedding reads int32 token ids, got ", DTypeName(x.dtype())));
  }
  return backend_->EmbeddingForward(x.numel(), static_cast<int>(config_.num_embeddings),
                                    static_cast<int>(config_.embedding_dim), x.i32(),
                                    weight_.value.f32(), y->f32());
}

absl::Status Embedding::Backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) {
  if (dx != nullptr) {
    return absl::InvalidArgumentError("embedding: token ids have no gradient (dx must be null)");
  }
  return backend_->EmbeddingBackward(x.numel(), static_cast<int>(config_.num_embeddings),
                                     static_cast<int>(config_.embedding_dim), x.i32(), dy.f32(),
                                     weight_.grad.f32());
}

absl::StatusOr<std::unique_ptr<Layer>> PositionEmbedding::Create(const PositionEmbeddingConfig& c,
                                                                 Backend* backend,
                                                                 const Shape& shape, Rng* rng) {
  KILN_RETURN_IF_ERROR(OutputShape(c, shape).status());
  auto layer = std::unique_ptr<PositionEmbedding>(new PositionEmbedding(backend, shape));
  KILN_RETURN_IF_ERROR(InitNormalParameter(backend, "weight", {c.block_size, c.embedding_dim},
                                           kInitStd, rng, &layer->weight_));
  return std::unique_ptr<Layer>(std::move(layer));
}

// The table's first T rows are its first T * dim values: one bias over the (B, T * dim) batch.
absl::Status PositionEmbedding::Forward(const Tensor& x, Tensor* y, Mode) {
  const int per_sample = static_cast<int>(NumElements(input_shape_));
  const int batch = static_cast<int>(x.dim(0));
  KILN_RETURN_IF_ERROR(backend_->Copy(x, y, x.bytes()));
  return backend_->BiasForward(batch, per_sample, weight_.value.f32(), y->f32());
}

absl::Status PositionEmbedding::ForwardAt(const std::vector<const Tensor*>& xs,
                                          int64_t position_offset, KvCache*, Tensor* y) {
  if (xs.size() != 1) return InputCountError(xs.size());
  const Tensor& x = *xs[0];
  const int64_t dim = weight_.value.dim(1), rows = weight_.value.dim(0);
  const int64_t t = x.numel() / dim;
  if (position_offset < 0 || position_offset + t > rows) {
    return absl::InvalidArgumentError(absl::StrCat("position_embedding: positions ",
                                                   position_offset, "..", position_offset + t - 1,
                                                   " are outside block_size ", rows));
  }
  KILN_RETURN_IF_ERROR(backend_->Copy(x, y, x.bytes()));
  return backend_->BiasForward(1, static_cast<int>(t * dim),
                               weight_.value.f32() + position_offset * dim, y->f32());
}

absl::Status PositionEmbedding::Backward(const Tensor& x, const Tensor&, const Tensor& dy,
                                         Tensor* dx) {
  const int per_sample = static_cast<int>(NumElements(input_shape_));
  const int batch = static_cast<int>(x.dim(0));
  KILN_RETURN_IF_ERROR(backend_->BiasBackward(batch, per_sample, dy.f32(), weight_.grad.f32()));
  if (dx == nullptr) return absl::OkStatus();
  return backend_->Copy(dy, dx, dy.bytes());
}

}  // namespace kiln
