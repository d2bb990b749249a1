#include "engine/layers/attention.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/layers/layer_rules.h"
#include "engine/layers/parameter_init.h"

namespace kiln {

namespace {

// y (rows, out) = x (rows, in) W^T + b, W (out, in); b may be null.
absl::Status LinearForward(Backend* be, int64_t rows, int64_t in, int64_t out, const float* x,
                           const float* w, const float* b, float* y) {
  KILN_RETURN_IF_ERROR(be->Gemm(Transpose::kNo, Transpose::kYes, static_cast<int>(rows),
                                static_cast<int>(out), static_cast<int>(in), 1.0f, x, w, 0.0f, y));
  if (b == nullptr) return absl::OkStatus();
  return be->BiasForward(static_cast<int>(rows), static_cast<int>(out), b, y);
}

// dW += dy^T x, db += sum of dy's rows (when not null), dx = dy W (when not null).
absl::Status LinearBackward(Backend* be, int64_t rows, int64_t in, int64_t out, const float* x,
                            const float* w, const float* dy, float* dw, float* db, float* dx) {
  const int r = static_cast<int>(rows), i = static_cast<int>(in), o = static_cast<int>(out);
  KILN_RETURN_IF_ERROR(be->Gemm(Transpose::kYes, Transpose::kNo, o, i, r, 1.0f, dy, x, 1.0f, dw));
  if (db != nullptr) KILN_RETURN_IF_ERROR(be->BiasBackward(r, o, dy, db));
  if (dx == nullptr) return absl::OkStatus();
  return be->Gemm(Transpose::kNo, Transpose::kNo, r, i, o, 1.0f, dy, w, 0.0f, dx);
}

absl::Status Ensure(Backend* be, const Shape& shape, Tensor* t) {
  if (t->Reshape(shape)) return absl::OkStatus();
  KILN_ASSIGN_OR_RETURN(*t, be->Allocate(DType::kF32, shape));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Shape> OutputShape(const CausalSelfAttentionConfig& c, const Shape& in) {
  KILN_RETURN_IF_ERROR(CheckPositive("n_head", c.n_head));
  KILN_RETURN_IF_ERROR(CheckPositive("n_embd", c.n_embd));
  if (c.n_embd % c.n_head != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("n_embd ", c.n_embd, " is not a multiple of n_head ", c.n_head));
  }
  if (!(c.dropout >= 0.0f && c.dropout < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("dropout must be in [0, 1), got ", c.dropout));
  }
  if (in.size() != 2 || in[1] != c.n_embd) {
    return absl::InvalidArgumentError(
        absl::StrCat("needs a (T, ", c.n_embd, ") input but input is ", ShapeString(in)));
  }
  // One sample's weights (n_head, T, T) index with int on the backends.
  if (in[0] > std::numeric_limits<int>::max() / in[0] / c.n_head) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence length ", in[0], " is too long for ", c.n_head, " heads"));
  }
  return in;
}

int64_t ParameterCount(const CausalSelfAttentionConfig& c) {
  const int64_t d = c.n_embd;
  return 3 * d * d + d * d + (c.bias ? 3 * d + d : 0);
}

int64_t AttentionSavedElements(const CausalSelfAttentionConfig& c, int64_t t) {
  const int64_t values = t * c.n_embd, weights = c.n_head * t * t;
  // qkv, scratch, split, dsplit; weights and their gradient; heads and merged.
  int64_t n = 4 * 3 * values + 2 * weights + 2 * values;
  if (c.dropout > 0) n += 2 * weights + 2 * values;  // dropped weights, masks, c_proj's output
  return n;
}

absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const CausalSelfAttentionConfig& c,
                                                 const LayerContext& ctx) {
  return CausalSelfAttention::Create(c, ctx.backend, ctx.input, ctx.rng, ctx.stream_seed);
}

absl::StatusOr<std::unique_ptr<Layer>> CausalSelfAttention::Create(
    const CausalSelfAttentionConfig& c, Backend* backend, const Shape& shape, Rng* rng,
    uint64_t seed) {
  KILN_RETURN_IF_ERROR(OutputShape(c, shape).status());
  auto layer =
      std::unique_ptr<CausalSelfAttention>(new CausalSelfAttention(c, backend, shape, seed));
  const int64_t d = c.n_embd;
  const float bound = 1.0f / std::sqrt(static_cast<float>(d));  // nn.Linear's, fan_in d for both
  KILN_RETURN_IF_ERROR(
      InitUniformParameter(backend, "c_attn.weight", {3 * d, d}, bound, rng, &layer->attn_weight_));
  if (c.bias) {
    KILN_RETURN_IF_ERROR(
        InitUniformParameter(backend, "c_attn.bias", {3 * d}, bound, rng, &layer->attn_bias_));
  }
  KILN_RETURN_IF_ERROR(
      InitUniformParameter(backend, "c_proj.weight", {d, d}, bound, rng, &layer->proj_weight_));
  if (c.bias) {
    KILN_RETURN_IF_ERROR(
        InitUniformParameter(backend, "c_proj.bias", {d}, bound, rng, &layer->proj_bias_));
  }
  layer->t_ = shape[0];
  layer->heads_ = c.n_head;
  layer->head_dim_ = d / c.n_head;
  return std::unique_ptr<Layer>(std::move(layer));
}

std::vector<Parameter*> CausalSelfAttention::parameters() {
  if (config_.bias) return {&attn_weight_, &attn_bias_, &proj_weight_, &proj_bias_};
  return {&attn_weight_, &proj_weight_};
}

absl::Status CausalSelfAttention::EnsureBuffers(int64_t batch) {
  batch_ = batch;
  const int64_t rows = batch * t_, d = config_.n_embd, bh = batch * heads_;
  Backend* be = backend_;
  KILN_RETURN_IF_ERROR(Ensure(be, {rows, 3 * d}, &qkv_));
  KILN_RETURN_IF_ERROR(Ensure(be, {3, rows, d}, &scratch_));
  KILN_RETURN_IF_ERROR(Ensure(be, {3 * batch, heads_, t_, head_dim_}, &split_));
  KILN_RETURN_IF_ERROR(Ensure(be, {3 * batch, heads_, t_, head_dim_}, &dsplit_));
  KILN_RETURN_IF_ERROR(Ensure(be, {bh, t_, t_}, &att_));
  KILN_RETURN_IF_ERROR(Ensure(be, {bh, t_, t_}, &datt_));
  KILN_RETURN_IF_ERROR(Ensure(be, {batch, heads_, t_, head_dim_}, &heads_out_));
  KILN_RETURN_IF_ERROR(Ensure(be, {rows, d}, &merged_));
  if (config_.dropout > 0) {
    KILN_RETURN_IF_ERROR(Ensure(be, {bh, t_, t_}, &dropped_));
    KILN_RETURN_IF_ERROR(Ensure(be, {bh, t_, t_}, &att_mask_));
    KILN_RETURN_IF_ERROR(Ensure(be, {rows, d}, &proj_));
    KILN_RETURN_IF_ERROR(Ensure(be, {rows, d}, &proj_mask_));
  }
  return absl::OkStatus();
}

absl::Status CausalSelfAttention::Drop(int64_t n, const float* x, float* mask, float* y) {
  KILN_RETURN_IF_ERROR(backend_->DropoutForward(n, config_.dropout, seed_, offset_, x, mask, y));
  offset_ += static_cast<uint64_t>(n);
  return absl::OkStatus();
}

// split_ (3B, H, T, hd) -> att_ = causal_softmax(q k^T * scale) -> merged_ (B*T, C).
absl::Status CausalSelfAttention::HeadsForward(bool drop) {
  const int t = static_cast<int>(t_), hd = static_cast<int>(head_dim_);
  const int bh = static_cast<int>(batch_ * heads_);
  const int64_t head = batch_ * t_ * config_.n_embd, mat = t_ * head_dim_, sq = t_ * t_;
  const float *q = split_.f32(), *k = q + head, *v = k + head;
  Backend* be = backend_;
  KILN_RETURN_IF_ERROR(be->GemmStridedBatched(Transpose::kNo, Transpose::kYes, t, t, hd, 1.0f, q,
                                              mat, k, mat, 0.0f, att_.f32(), sq, bh));
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim_));
  KILN_RETURN_IF_ERROR(be->CausalSoftmaxForward(bh, t, scale, att_.f32(), att_.f32()));
  const float* p = att_.f32();
  if (drop) {
    KILN_RETURN_IF_ERROR(Drop(att_.numel(), att_.f32(), att_mask_.f32(), dropped_.f32()));
    p = dropped_.f32();
  }
  KILN_RETURN_IF_ERROR(be->GemmStridedBatched(Transpose::kNo, Transpose::kNo, t, hd, t, 1.0f, p, sq,
                                              v, mat, 0.0f, heads_out_.f32(), mat, bh));
  // (B, H, T, hd) -> (B, T, H, hd) = (B*T, C)
  return be->Transpose0213(batch_, heads_, t_, head_dim_, heads_out_.f32(), merged_.f32());
}

absl::Status CausalSelfAttention::Forward(const Tensor& x, Tensor* y, Mode mode) {
  KILN_RETURN_IF_ERROR(EnsureBuffers(x.dim(0)));
  const bool drop = mode == Mode::kTrain && config_.dropout > 0;
  dropped_last_ = drop;
  const int64_t rows = batch_ * t_, d = config_.n_embd;
  Backend* be = backend_;
  KILN_RETURN_IF_ERROR(LinearForward(be, rows, d, 3 * d, x.f32(), attn_weight_.value.f32(),
                                     config_.bias ? attn_bias_.value.f32() : nullptr, qkv_.f32()));
  // qkv (B*T, 3, C) as (1, B*T, 3, C) -> (3, B*T, C) = (3B, T, H, hd) -> (3B, H, T, hd)
  KILN_RETURN_IF_ERROR(be->Transpose0213(1, rows, 3, d, qkv_.f32(), scratch_.f32()));
  KILN_RETURN_IF_ERROR(
      be->Transpose0213(3 * batch_, t_, heads_, head_dim_, scratch_.f32(), split_.f32()));
  KILN_RETURN_IF_ERROR(HeadsForward(drop));
  float* proj = drop ? proj_.f32() : y->f32();
  KILN_RETURN_IF_ERROR(LinearForward(be, rows, d, d, merged_.f32(), proj_weight_.value.f32(),
                                     config_.bias ? proj_bias_.value.f32() : nullptr, proj));
  if (drop) KILN_RETURN_IF_ERROR(Drop(rows * d, proj, proj_mask_.f32(), y->f32()));
  return absl::OkStatus();
}

absl::Status CausalSelfAttention::EnsureCache(KvCache* cache) const {
  if (!cache->k.empty()) return absl::OkStatus();
  const int64_t cap = t_, d = config_.n_embd;
  Backend* be = backend_;
  KILN_ASSIGN_OR_RETURN(cache->k, be->Allocate(DType::kF32, {heads_, cap, head_dim_}));
  KILN_ASSIGN_OR_RETURN(cache->v, be->Allocate(DType::kF32, {heads_, cap, head_dim_}));
  KILN_ASSIGN_OR_RETURN(cache->qkv, be->Allocate(DType::kF32, {cap, 3 * d}));
  KILN_ASSIGN_OR_RETURN(cache->transposed, be->Allocate(DType::kF32, {3, cap, d}));
  KILN_ASSIGN_OR_RETURN(cache->split, be->Allocate(DType::kF32, {3, heads_, cap, head_dim_}));
  KILN_ASSIGN_OR_RETURN(cache->weights, be->Allocate(DType::kF32, {heads_, cap, cap}));
  KILN_ASSIGN_OR_RETURN(cache->heads, be->Allocate(DType::kF32, {heads_, cap, head_dim_}));
  KILN_ASSIGN_OR_RETURN(cache->merged, be->Allocate(DType::kF32, {cap, d}));
  cache->length = 0;
  return absl::OkStatus();
}

// cache->split (3, H, t, hd) holds the new positions' q, k, v: k and v join the cache at
// `offset`, then each new query attends over keys 0..its position (L = offset + t of them).
absl::Status CausalSelfAttention::HeadsForwardAt(int64_t t, int64_t offset, KvCache* cache) {
  const int64_t cap = t_, hd = head_dim_, len = offset + t, mat = t * hd;
  const float *q = cache->split.f32(), *k = q + heads_ * mat, *v = k + heads_ * mat;
  Backend* be = backend_;
  // Head h's new rows go to rows offset.. of its (cap, hd) block.
  KILN_RETURN_IF_ERROR(be->Copy2D(heads_, mat, k, mat, cache->k.f32() + offset * hd, cap * hd));
  KILN_RETURN_IF_ERROR(be->Copy2D(heads_, mat, v, mat, cache->v.f32() + offset * hd, cap * hd));
  const int ti = static_cast<int>(t), li = static_cast<int>(len), hdi = static_cast<int>(hd);
  const int h = static_cast<int>(heads_);
  // weights (H, t, L) = q (H, t, hd) k^T, k the cache's first L rows of each head.
  KILN_RETURN_IF_ERROR(be->GemmStridedBatched(Transpose::kNo, Transpose::kYes, ti, li, hdi, 1.0f, q,
                                              mat, cache->k.f32(), cap * hd, 0.0f,
                                              cache->weights.f32(), t * len, h));
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim_));
  KILN_RETURN_IF_ERROR(be->CausalSoftmaxForwardAt(heads_, ti, li, static_cast<int>(offset), scale,
                                                  cache->weights.f32(), cache->weights.f32()));
  KILN_RETURN_IF_ERROR(be->GemmStridedBatched(Transpose::kNo, Transpose::kNo, ti, hdi, li, 1.0f,
                                              cache->weights.f32(), t * len, cache->v.f32(),
                                              cap * hd, 0.0f, cache->heads.f32(), mat, h));
  // (H, t, hd) -> (t, H, hd) = (t, C)
  return be->Transpose0213(1, heads_, t, hd, cache->heads.f32(), cache->merged.f32());
}

absl::Status CausalSelfAttention::ForwardAt(const std::vector<const Tensor*>& xs,
                                            int64_t position_offset, KvCache* cache, Tensor* y) {
  if (xs.size() != 1) return InputCountError(xs.size());
  if (cache == nullptr) {
    return absl::InvalidArgumentError("causal_self_attention: ForwardAt needs a KV cache");
  }
  const Tensor& x = *xs[0];
  const int64_t d = config_.n_embd, t = x.numel() / d;
  KILN_RETURN_IF_ERROR(EnsureCache(cache));
  if (position_offset != cache->length || t < 1 || position_offset + t > t_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "causal_self_attention: positions ", position_offset, "..", position_offset + t - 1,
        " do not follow the ", cache->length, " cached ones within the sequence length ", t_));
  }
  Backend* be = backend_;
  KILN_RETURN_IF_ERROR(LinearForward(be, t, d, 3 * d, x.f32(), attn_weight_.value.f32(),
                                     config_.bias ? attn_bias_.value.f32() : nullptr,
                                     cache->qkv.f32()));
  // qkv (t, 3, C) -> (3, t, C) = (3, t, H, hd) -> (3, H, t, hd), as Forward with one sample.
  KILN_RETURN_IF_ERROR(be->Transpose0213(1, t, 3, d, cache->qkv.f32(), cache->transposed.f32()));
  KILN_RETURN_IF_ERROR(
      be->Transpose0213(3, t, heads_, head_dim_, cache->transposed.f32(), cache->split.f32()));
  KILN_RETURN_IF_ERROR(HeadsForwardAt(t, position_offset, cache));
  KILN_RETURN_IF_ERROR(LinearForward(be, t, d, d, cache->merged.f32(), proj_weight_.value.f32(),
                                     config_.bias ? proj_bias_.value.f32() : nullptr, y->f32()));
  cache->length = position_offset + t;
  return absl::OkStatus();
}

// From dmerged (in merged_) to dsplit_: the forward's per-head products, backwards.
absl::Status CausalSelfAttention::HeadsBackward(bool drop) {
  const int t = static_cast<int>(t_), hd = static_cast<int>(head_dim_);
  const int bh = static_cast<int>(batch_ * heads_);
  const int64_t head = batch_ * t_ * config_.n_embd, mat = t_ * head_dim_, sq = t_ * t_;
  const float *q = split_.f32(), *k = q + head, *v = k + head;
  float *dq = dsplit_.f32(), *dk = dq + head, *dv = dk + head;
  float* dheads = heads_out_.f32();  // the forward's heads are not needed again
  Backend* be = backend_;
  KILN_RETURN_IF_ERROR(be->Transpose0213(batch_, t_, heads_, head_dim_, merged_.f32(), dheads));
  const float* p = drop ? dropped_.f32() : att_.f32();
  // d(weights used) = dheads v^T; dv = (weights used)^T dheads
  KILN_RETURN_IF_ERROR(be->GemmStridedBatched(Transpose::kNo, Transpose::kYes, t, t, hd, 1.0f,
                                              dheads, mat, v, mat, 0.0f, datt_.f32(), sq, bh));
  KILN_RETURN_IF_ERROR(be->GemmStridedBatched(Transpose::kYes, Transpose::kNo, t, hd, t, 1.0f, p,
                                              sq, dheads, mat, 0.0f, dv, mat, bh));
  if (drop) {
    KILN_RETURN_IF_ERROR(
        be->DropoutBackward(datt_.numel(), att_mask_.f32(), datt_.f32(), datt_.f32()));
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim_));
  KILN_RETURN_IF_ERROR(
      be->CausalSoftmaxBackward(bh, t, scale, att_.f32(), datt_.f32(), datt_.f32()));
  // dq = dscores k; dk = dscores^T q (the scale is inside the softmax's backward)
  KILN_RETURN_IF_ERROR(be->GemmStridedBatched(Transpose::kNo, Transpose::kNo, t, hd, t, 1.0f,
                                              datt_.f32(), sq, k, mat, 0.0f, dq, mat, bh));
  return be->GemmStridedBatched(Transpose::kYes, Transpose::kNo, t, hd, t, 1.0f, datt_.f32(), sq, q,
                                mat, 0.0f, dk, mat, bh);
}

absl::Status CausalSelfAttention::Backward(const Tensor& x, const Tensor&, const Tensor& dy,
                                           Tensor* dx) {
  if (x.dim(0) != batch_) {
    return absl::FailedPreconditionError("causal_self_attention: Backward of another batch");
  }
  const bool drop = dropped_last_;
  const int64_t rows = batch_ * t_, d = config_.n_embd;
  Backend* be = backend_;
  const float* dproj = dy.f32();
  if (drop) {
    KILN_RETURN_IF_ERROR(be->DropoutBackward(rows * d, proj_mask_.f32(), dy.f32(), proj_.f32()));
    dproj = proj_.f32();
  }
  // c_proj's gradients read merged_ before it takes dmerged.
  KILN_RETURN_IF_ERROR(LinearBackward(be, rows, d, d, merged_.f32(), proj_weight_.value.f32(),
                                      dproj, proj_weight_.grad.f32(),
                                      config_.bias ? proj_bias_.grad.f32() : nullptr, nullptr));
  KILN_RETURN_IF_ERROR(be->Gemm(Transpose::kNo, Transpose::kNo, static_cast<int>(rows),
                                static_cast<int>(d), static_cast<int>(d), 1.0f, dproj,
                                proj_weight_.value.f32(), 0.0f, merged_.f32()));
  KILN_RETURN_IF_ERROR(HeadsBackward(drop));
  // dsplit (3B, H, T, hd) -> (3B, T, H, hd) = (3, B*T, C) -> dqkv (B*T, 3, C), into qkv_
  KILN_RETURN_IF_ERROR(
      be->Transpose0213(3 * batch_, heads_, t_, head_dim_, dsplit_.f32(), scratch_.f32()));
  KILN_RETURN_IF_ERROR(be->Transpose0213(1, 3, rows, d, scratch_.f32(), qkv_.f32()));
  return LinearBackward(be, rows, d, 3 * d, x.f32(), attn_weight_.value.f32(), qkv_.f32(),
                        attn_weight_.grad.f32(), config_.bias ? attn_bias_.grad.f32() : nullptr,
                        dx != nullptr ? dx->f32() : nullptr);
}

}  // namespace kiln
