// Text generation from a sequence model, as nanoGPT's sample.py: each new token is drawn from the
// last position's logits divided by a temperature, filtered to the top k, softmaxed, then fed
// back. With a KV cache (Model::ForwardAt) a new token runs one position; without, the whole
// context runs again. Past the model's context T, the context is cropped to the last T tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"
#include "engine/model/sequence_model.h"

namespace kiln {

struct GenerationParams {
  int64_t max_tokens = 100;  // tokens to generate: 1..MaxGenerationTokens(T)
  // Logits are divided by it before the softmax: < 1 sharpens, > 1 flattens. 0 takes the most
  // likely token every time (greedy, no draw). Finite and >= 0.
  double temperature = 1.0;
  // Keep only the k largest logits (and any tied with the k-th, as nanoGPT's filter does);
  // 0 keeps all. 0..vocab.
  int64_t top_k = 0;
  // The draws' stream: draw i (the i-th generated token) reads CounterUniform(seed, i), so the same
  // seed gives the same tokens on every backend, with or without the cache.
  uint64_t seed = 0;
  // Incremental decoding with a KV cache; false reruns the whole context for every token.
  bool use_kv_cache = true;
};

// Called with each token as soon as it is chosen; returning false stops generation after it.
using TokenCallback = std::function<bool(int32_t token)>;

// The most tokens one generation may ask for: 64 contexts' worth.
inline int64_t MaxGenerationTokens(int64_t context) { return 64 * context; }

// Everything Generate refuses, checked without building the model (a server validates requests
// with it): the model is a sequence model (SequenceModelShapeOf), the prompt has 1..T tokens
// within the model's ids, and the parameters are in their ranges. InvalidArgument naming the
// parameter and its bounds; returns the model's shape.
absl::StatusOr<SequenceModelShape> CheckGeneration(const ModelConfig& config,
                                                   const std::vector<int32_t>& prompt,
                                                   const GenerationParams& params);

// Generates up to params.max_tokens tokens after `prompt` and returns them, without the prompt;
// fewer when on_token stops early. Refuses what CheckGeneration refuses, and, with or without the
// cache, a model that is not causal (Model::CheckIncremental names the layer). Runs the model in
// eval mode on its backend. Non-finite logits are DATA_LOSS. Uses the model alone while it runs.
absl::StatusOr<std::vector<int32_t>> Generate(Model* model, const std::vector<int32_t>& prompt,
                                              const GenerationParams& params,
                                              const TokenCallback& on_token = {});

// The sampling rule on one position's finite logits (vocab of them): with temperature 0 the first
// largest; otherwise softmax(logits / temperature) over the top_k (0: all) drawn with
// CounterUniform(seed, draw). Pure: the same arguments give the same token.
int32_t SampleToken(const float* logits, int64_t vocab, double temperature, int64_t top_k,
                    uint64_t seed, uint64_t draw);

}  // namespace kiln
