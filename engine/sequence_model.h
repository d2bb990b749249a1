// What makes a model a sequence model, the kind generation and incremental decoding run: it reads
// T int32 token ids per sample (embeddings read them) and every node's output is per position,
// (T, ...), the last one (T, vocab) logits with vocab no more than the ids embedded, so that a
// generated token can be read back.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/model_config.h"

namespace kiln {

struct SequenceModelShape {
  int64_t context = 0;    // T: the positions the model runs at once (input_shape[0])
  int64_t vocab = 0;      // logits per position: the output's last dimension
  int64_t token_ids = 0;  // the ids the embeddings take: [0, token_ids)
};

// The shape of a sequence model, or InvalidArgument saying what the model takes or gives
// instead ("generation needs a sequence model ...; this model takes 1x28x28 floats"), or naming
// the node whose output is not per position. Shape errors of InferShapes pass through.
absl::StatusOr<SequenceModelShape> SequenceModelShapeOf(const ModelConfig& config);

}  // namespace kiln
