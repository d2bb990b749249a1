// KServe v2 tensors to and from a language model's token ids: checks a request's "input" of
// INT64 or INT32 ids [batch, length] and lays out its "logits" output, FP32 [batch, vocab].
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "inference/grpc_service.pb.h"

namespace kiln::serving {

inline constexpr char kLogitsOutput[] = "logits";  // FP32 [batch, vocab]: the last position's

// A request's prompts: `batch` rows of `length` ids, row-major.
struct TokenInput {
  std::vector<int32_t> ids;
  int64_t batch = 0, length = 0;
};

// Checks the request's one input "input" against a model of `context` positions taking ids in
// [0, token_ids): INT64 or INT32, typed (int64_contents / int_contents) or raw little-endian,
// shape [batch >= 1, 1..context], every id in range; only the "logits" output may be asked for.
// InvalidArgument naming the input (or output) and what is wrong.
absl::StatusOr<TokenInput> DecodeTokenInput(const inference::ModelInferRequest& request,
                                            int64_t context, int64_t token_ids);

// Adds the "logits" output tensor [batch, vocab] to `response`, typed, or raw when `raw`, and
// returns where its floats go (memcpy: raw storage need not be aligned).
char* PrepareLogits(int64_t batch, int64_t vocab, bool raw,
                    inference::ModelInferResponse* response);

}  // namespace kiln::serving
