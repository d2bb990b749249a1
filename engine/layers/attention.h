// Causal multi-head self-attention as nanoGPT's CausalSelfAttention: over a (T, n_embd)
// sequence, qkv = c_attn(x) split into n_head heads of q, k, v; each head's weights are
// causal_softmax(q k^T / sqrt(head_dim)) (dropped out with p = dropout in training), times v;
// the heads merge back and y = c_proj(them), dropped out again (nanoGPT's resid_dropout).
// Parameters c_attn.weight (3 n_embd, n_embd), c_attn.bias (3 n_embd), c_proj.weight
// (n_embd, n_embd), c_proj.bias (n_embd): PyTorch's (out, in) layout, init as its nn.Linear.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/layers/layer.h"
#include "engine/model/model_config.h"

namespace kiln {

// The same shape as its (T, n_embd) input; n_embd a multiple of n_head.
absl::StatusOr<Shape> OutputShape(const CausalSelfAttentionConfig& c, const Shape& input);
int64_t ParameterCount(const CausalSelfAttentionConfig& c);
absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const CausalSelfAttentionConfig& c,
                                                 const LayerContext& ctx);
// The floats the layer keeps per sample for its backward and as scratch (q, k, v split out, the
// attention weights and their gradient, the heads; with dropout its masks), for memory plans.
int64_t AttentionSavedElements(const CausalSelfAttentionConfig& c, int64_t t);

class CausalSelfAttention final : public Layer {
 public:
  static absl::StatusOr<std::unique_ptr<Layer>> Create(const CausalSelfAttentionConfig& c,
                                                       Backend* backend, const Shape& shape,
                                                       Rng* rng, uint64_t seed);
  const char* type() const override { return "causal_self_attention"; }
  // Appends the new positions' keys and values to `cache` and attends each new query over the
  // cached keys up to its own position (eval mode: no dropout). The cache must hold exactly the
  // positions before position_offset.
  Incremental incremental() const override { return Incremental::kOwn; }
  absl::Status ForwardAt(const std::vector<const Tensor*>& xs, int64_t position_offset,
                         KvCache* cache, Tensor* y) override;
  absl::Status Forward(const Tensor& x, Tensor* y, Mode mode) override;
  absl::Status Backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override;
  std::vector<Parameter*> parameters() override;

  // Both dropouts draw from the layer's one stream, the weights' first.
  bool has_random_stream() const override { return true; }
  uint64_t random_offset() const override { return offset_; }
  void set_random_offset(uint64_t offset) override { offset_ = offset; }

 private:
  CausalSelfAttention(const CausalSelfAttentionConfig& c, Backend* backend, const Shape& shape,
                      uint64_t seed)
      : Layer(backend, shape, shape), config_(c), seed_(seed) {}
  // Sizes the saved buffers for `batch` samples (allocating only when they grow).
  absl::Status EnsureBuffers(int64_t batch);
  // The per-head products of the forward (from split_ to merged_) and of the backward (from
  // dmerged, in merged_, to dsplit_).
  absl::Status HeadsForward(bool drop);
  absl::Status HeadsBackward(bool drop);
  absl::Status Drop(int64_t n, const float* x, float* mask, float* y);
  // Allocates a fresh cache's tensors for up to t_ positions.
  absl::Status EnsureCache(KvCache* cache) const;
  // ForwardAt's per-head products: from cache->split (the t new q, k, v) to cache->merged.
  absl::Status HeadsForwardAt(int64_t t, int64_t offset, KvCache* cache);

  CausalSelfAttentionConfig config_;
  uint64_t seed_;
  uint64_t offset_ = 0;
  bool dropped_last_ = false;  // whether the last Forward dropped out (training, p > 0)
  int64_t batch_ = 0, t_ = 0, heads_ = 0, head_dim_ = 0;
  Parameter attn_weight_, attn_bias_, proj_weight_, proj_bias_;
  // qkv_ (B*T, 3C) is c_attn's output, then the backward's dqkv; split_ q, k, v of (B, H, T, hd)
  // each; scratch_ the transposes' middle step; att_ the weights P (B*H, T, T) and datt_ their
  // gradient; dropped_ P after dropout and att_mask_ its mask; heads_out_ (B, H, T, hd) and
  // merged_ (B*T, C) the heads before and after merging; proj_ and proj_mask_ c_proj's output
  // before the residual dropout and its mask.
  Tensor qkv_, scratch_, split_, dsplit_, att_, datt_, dropped_, att_mask_, heads_out_, merged_,
      proj_, proj_mask_;
};

}  // namespace kiln
