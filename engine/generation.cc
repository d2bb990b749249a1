#include "engine/generation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/rng.h"

namespace kiln {

namespace {

// The logits of the token after a sequence, from the model with or without a KV cache. Past the
// context T both run the last T tokens: positions are absolute (learned position embeddings), so
// once the window slides every cached key is stale and the cached runner prefills again.
class NextTokenLogits {
 public:
  static absl::StatusOr<std::unique_ptr<NextTokenLogits>> Create(Model* model,
                                                                 const SequenceModelShape& shape,
                                                                 bool cached) {
    auto r = std::unique_ptr<NextTokenLogits>(new NextTokenLogits(model, shape));
    Backend* be = model->backend();
    if (cached) {
      KILN_ASSIGN_OR_RETURN(r->state_, model->NewDecodeState());
    }
    KILN_ASSIGN_OR_RETURN(r->ids_, be->Allocate(DType::kI32, {1, shape.context}));
    KILN_ASSIGN_OR_RETURN(r->row_, be->Allocate(DType::kF32, {shape.vocab}));
    r->logits_.resize(static_cast<size_t>(shape.vocab));
    return r;
  }

  // The next token's logits after `tokens` (which extend those of the previous call).
  absl::StatusOr<const std::vector<float>*> After(const std::vector<int32_t>& tokens) {
    const Tensor* out = nullptr;
    int64_t last = 0;  // the row of `out` that predicts the next token
    if (state_ != nullptr) {
      KILN_ASSIGN_OR_RETURN(out, RunCached(tokens));
      last = out->dim(1) - 1;
    } else {
      KILN_ASSIGN_OR_RETURN(out, RunWhole(tokens, &last));
    }
    const int64_t v = shape_.vocab;
    Backend* be = model_->backend();
    KILN_RETURN_IF_ERROR(be->Copy2D(1, v, out->f32() + last * v, v, row_.f32(), v));
    KILN_RETURN_IF_ERROR(be->CopyToHost(row_, logits_.data(), row_.bytes()));
    for (float z : logits_) {
      if (!std::isfinite(z)) {
        return absl::DataLossError(absl::StrCat("the model's logits after ", tokens.size(),
                                                " tokens are not finite (", z, ")"));
      }
    }
    return &logits_;
  }

 private:
  NextTokenLogits(Model* model, const SequenceModelShape& shape) : model_(model), shape_(shape) {}

  // Runs ids[from..] as (1, n) through the cache.
  absl::StatusOr<const Tensor*> RunAt(const std::vector<int32_t>& tokens, size_t from) {
    const int64_t n = static_cast<int64_t>(tokens.size() - from);
    ids_.Reshape({1, n});
    KILN_RETURN_IF_ERROR(
        model_->backend()->CopyFromHost(tokens.data() + from, static_cast<size_t>(n) * 4, &ids_));
    return model_->ForwardAt(ids_, state_.get());
  }

  // The cache holds tokens[start_ .. start_ + length): run what follows, or, when the window would
  // pass T, the last T tokens afresh.
  absl::StatusOr<const Tensor*> RunCached(const std::vector<int32_t>& tokens) {
    const size_t held = start_ + static_cast<size_t>(state_->length());
    if (tokens.size() - start_ > static_cast<size_t>(shape_.context)) {
      start_ = tokens.size() - static_cast<size_t>(shape_.context);
      state_->Reset();
      return RunAt(tokens, start_);
    }
    return RunAt(tokens, held);
  }

  // The last min(n, T) tokens padded to T with id 0 through Model::Forward: causal attention
  // keeps the padding out of the rows before it. *last is the context's last row.
  absl::StatusOr<const Tensor*> RunWhole(const std::vector<int32_t>& tokens, int64_t* last) {
    const size_t t = static_cast<size_t>(shape_.context);
    const size_t n = std::min(tokens.size(), t);
    std::vector<int32_t> window(t, 0);
    std::copy(tokens.end() - static_cast<std::ptrdiff_t>(n), tokens.end(), window.begin());
    ids_.Reshape({1, shape_.context});
    KILN_RETURN_IF_ERROR(model_->backend()->CopyFromHost(window.data(), t * 4, &ids_));
    *last = static_cast<int64_t>(n) - 1;
    return model_->Forward(ids_, Mode::kEval);
  }

  Model* model_;
  SequenceModelShape shape_;
  std::unique_ptr<DecodeState> state_;  // null without the cache
  size_t start_ = 0;                    // the token at the cache's position 0
  Tensor ids_, row_;
  std::vector<float> logits_;
};

}  // namespace

absl::StatusOr<SequenceModelShape> CheckGeneration(const ModelConfig& config,
                                                   const std::vector<int32_t>& prompt,
                                                   const GenerationParams& params) {
  KILN_ASSIGN_OR_RETURN(SequenceModelShape shape, SequenceModelShapeOf(config));
  if (prompt.empty()) {
    return absl::InvalidArgumentError("the prompt is empty: generation needs at least one token");
  }
  if (static_cast<int64_t>(prompt.size()) > shape.context) {
    return absl::InvalidArgumentError(
        absl::StrCat("the prompt has ", prompt.size(), " tokens but the model's context (its ",
                     "block_size, input_shape[0]) is ", shape.context));
  }
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= shape.token_ids) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " is ", prompt[i],
                                                     ", outside the model's token ids 0..",
                                                     shape.token_ids - 1));
    }
  }
  const int64_t cap = MaxGenerationTokens(shape.context);
  if (params.max_tokens < 1 || params.max_tokens > cap) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens must be in 1..", cap, " (64 x the ",
                                                   shape.context, "-token context), got ",
                                                   params.max_tokens));
  }
  if (!std::isfinite(params.temperature) || params.temperature < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be finite and >= 0 (0: greedy), got ", params.temperature));
  }
  if (params.top_k < 0 || params.top_k > shape.vocab) {
    return absl::InvalidArgumentError(absl::StrCat("top_k must be in 0..", shape.vocab,
                                                   " (the vocabulary; 0 keeps every token), got ",
                                                   params.top_k));
  }
  return shape;
}

absl::StatusOr<std::vector<int32_t>> Generate(Model* model, const std::vector<int32_t>& prompt,
                                              const GenerationParams& params,
                                              const TokenCallback& on_token) {
  if (model == nullptr) return absl::InvalidArgumentError("Generate: no model");
  KILN_ASSIGN_OR_RETURN(SequenceModelShape shape, CheckGeneration(model->config(), prompt, params));
  // Both paths need a causal model: without the cache the context is padded after its end.
  KILN_RETURN_IF_ERROR(model->CheckIncremental());
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<NextTokenLogits> next,
                        NextTokenLogits::Create(model, shape, params.use_kv_cache));
  std::vector<int32_t> tokens = prompt, generated;
  for (int64_t i = 0; i < params.max_tokens; ++i) {
    KILN_ASSIGN_OR_RETURN(const std::vector<float>* logits, next->After(tokens));
    const int32_t token = SampleToken(logits->data(), shape.vocab, params.temperature, params.top_k,
                                      params.seed, static_cast<uint64_t>(i));
    tokens.push_back(token);
    generated.push_back(token);
    if (on_token && !on_token(token)) break;
  }
  return generated;
}

int32_t SampleToken(const float* logits, int64_t vocab, double temperature, int64_t top_k,
                    uint64_t seed, uint64_t draw) {
  const float* top = std::max_element(logits, logits + vocab);  // the first of ties
  if (temperature == 0) return static_cast<int32_t>(top - logits);
  // nanoGPT's filter: logits below the k-th largest are dropped, ties with it kept.
  float threshold = -std::numeric_limits<float>::infinity();
  if (top_k > 0 && top_k < vocab) {
    std::vector<float> sorted(logits, logits + vocab);
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(),
                     std::greater<float>());
    threshold = sorted[static_cast<size_t>(top_k - 1)];
  }
  // softmax((z - max) / temperature) in double: the largest weighs exp(0) = 1, none overflows.
  std::vector<double> weight(static_cast<size_t>(vocab), 0.0);
  double total = 0;
  for (int64_t j = 0; j < vocab; ++j) {
    if (logits[j] < threshold) continue;
    weight[j] = std::exp((static_cast<double>(logits[j]) - *top) / temperature);
    total += weight[j];
  }
  const double u = static_cast<double>(CounterUniform(seed, draw)) * total;
  double cumulative = 0;
  int64_t last_kept = top - logits;
  for (int64_t j = 0; j < vocab; ++j) {
    if (weight[j] == 0) continue;
    cumulative += weight[j];
    last_kept = j;
    if (u < cumulative) return static_cast<int32_t>(j);
  }
  return static_cast<int32_t>(last_kept);  // u within rounding of the total
}

}  // namespace kiln
