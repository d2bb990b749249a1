// What makes a model a sequence model, the kind generation and incremental decoding run: it reads
// T int32 token ids per sample (embeddings read them) and every node's output is per position,
// (T, ...), the last one (T, vocab) logits with vocab no more than the ids embedded, so that a
// generated token can be read back.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/model_config.h"

namespace kiln {

struct SequenceModelShape {
  int64_t context = 0;    // T: the positions the model runs at once (input_shape[0])
  int64_t vocab = 0;      // logits per position: the output's last dimension
  int64_t token_ids = 0;  // the ids the embeddings take: [0, token_ids)
};

// Whether an embedding reads the model's input: the model takes int32 token ids (a language
// model; InferShapes lets no other layer read ids). False for a config whose graph does not
// resolve.
bool ReadsTokenIds(const ModelConfig& config);

// The shape of a sequence model, or InvalidArgument saying what the model takes or gives
// instead ("a sequence model reads T int32 token ids ...; this model takes 1x28x28 floats"), or
// naming the node whose output is not per position. Shape errors of InferShapes pass through.
absl::StatusOr<SequenceModelShape> SequenceModelShapeOf(const ModelConfig& config);

// The rule for whether token data fit a language model, used by SubmitJob and the trainer: a
// sequence model (SequenceModelShapeOf) whose logits cover the data's `vocab_size` ids.
// InvalidArgument naming what is at odds; `which` names the data ("dataset \"chars\"").
absl::Status CheckModelFitsTokens(const ModelConfig& config, int64_t vocab_size,
                                  std::string_view which);

}  // namespace kiln
