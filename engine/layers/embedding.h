// Token and position embeddings of a GPT (nanoGPT's wte and wpe).
//
// Token ids flow as int32: a token model's input is an int32 tensor (batch, T), and only an
// embedding layer may read it (the model checks both at build and at Forward). Its output is the
// float (T, embedding_dim) of each sample; no gradient flows back into the ids.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/layers/layer.h"
#include "engine/model/model_config.h"

namespace kiln {

// (T, embedding_dim) for an input of T token ids.
absl::StatusOr<Shape> OutputShape(const EmbeddingConfig& c, const Shape& input);
inline int64_t ParameterCount(const EmbeddingConfig& c) {
  return c.num_embeddings * c.embedding_dim;
}
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const EmbeddingConfig& c, const LayerContext& ctx);

// The same shape as its (T, embedding_dim) input, T <= block_size.
absl::StatusOr<Shape> OutputShape(const PositionEmbeddingConfig& c, const Shape& input);
inline int64_t ParameterCount(const PositionEmbeddingConfig& c) {
  return c.block_size * c.embedding_dim;
}
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const PositionEmbeddingConfig& c,
                                                 const LayerContext& ctx);

// y[n, t] = weight[ids[n, t]], weight (num_embeddings, embedding_dim) from N(0, 0.02).
class Embedding final : public Layer {
 public:
  static absl::StatusOr<std::unique_ptr<Layer>> Create(const EmbeddingConfig& c, Backend* backend,
                                                       const Shape& input, Rng* rng);
  const char* type() const override { return "embedding"; }
  DType input_dtype() const override { return DType::kI32; }
  Incremental incremental() const override { return Incremental::kPositionWise; }
  absl::Status Forward(const Tensor& x, Tensor* y, Mode mode) override;
  // Accumulates the table's gradient; dx must be null (ids have none).
  absl::Status Backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;
  std::vector<Parameter*> parameters() override { return {&weight_}; }

 private:
  Embedding(const EmbeddingConfig& c, Backend* backend, const Shape& input, const Shape& output)
      : Layer(backend, input, output), config_(c) {}
  EmbeddingConfig config_;
  Parameter weight_;
};

// y[n, t] = x[n, t] + weight[t]: the first T rows of a learned (block_size, embedding_dim) table
// added to every sample, weight from N(0, 0.02).
class PositionEmbedding final : public Layer {
 public:
  static absl::StatusOr<std::unique_ptr<Layer>> Create(const PositionEmbeddingConfig& c,
                                                       Backend* backend, const Shape& shape,
                                                       Rng* rng);
  const char* type() const override { return "position_embedding"; }
  // Adds rows position_offset..position_offset+t-1 of the table to the t new positions.
  Incremental incremental() const override { return Incremental::kOwn; }
  absl::Status ForwardAt(const std::vector<const Tensor*>& xs, int64_t position_offset,
                         KvCache* cache, Tensor* y) override;
  absl::Status Forward(const Tensor& x, Tensor* y, Mode mode) override;
  absl::Status Backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;
  std::vector<Parameter*> parameters() override { return {&weight_}; }

 private:
  PositionEmbedding(Backend* backend, const Shape& shape) : Layer(backend, shape, shape) {}
  Parameter weight_;
};

}  // namespace kiln
