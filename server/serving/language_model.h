// A deployed sequence model (a GPT): its engine Model built from the checkpoint, its character
// vocabulary when it has one, and a mutex. The engine's Model runs one stream at a time (its
// layers keep per-call state), so a version's infers and generations take turns on it rather
// than each building a model of its own: one copy of the weights and activations per version,
// whatever the number of clients.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/data/char_vocabulary.h"
#include "engine/generation.h"
#include "engine/model/model.h"
#include "engine/model/sequence_model.h"

namespace kiln::serving {

class LanguageModel {
 public:
  // Builds the checkpoint's model on `backend` and loads its weights; `max_batch` prompts run
  // per forward pass at most. The vocabulary is CheckpointInfo::vocabulary (empty: none, the
  // model takes token ids only). InvalidArgument when the model is not a sequence model.
  static absl::StatusOr<std::unique_ptr<LanguageModel>> FromCheckpoint(const std::string& path,
                                                                       Backend* backend,
                                                                       int max_batch);

  const SequenceModelShape& shape() const { return shape_; }
  const ModelConfig& config() const { return model_->config(); }
  // Null when the checkpoint carries no vocabulary.
  const CharVocabulary* vocabulary() const { return vocabulary_ ? &*vocabulary_ : nullptr; }

  // `batch` prompts of `length` ids each (1..T, every id within the embedding's), row-major;
  // writes each one's logits at its last position, batch x vocab. Prompts shorter than T are
  // padded with id 0: the model is causal, so the padding after them changes nothing. Runs
  // max_batch prompts per pass. Waits its turn on the model.
  absl::Status LastLogits(const std::vector<int32_t>& ids, int64_t batch, int64_t length,
                          float* logits);

  // kiln::Generate on the model, its turn waited for; on_token as there.
  absl::StatusOr<std::vector<int32_t>> Generate(const std::vector<int32_t>& prompt,
                                                const GenerationParams& params,
                                                const TokenCallback& on_token);

 private:
  LanguageModel() = default;

  SequenceModelShape shape_;
  std::optional<CharVocabulary> vocabulary_;
  int max_batch_ = 1;
  Backend* backend_ = nullptr;
  std::mutex mu_;  // one infer or generation on model_ at a time
  std::unique_ptr<Model> model_;
};

}  // namespace kiln::serving
