// Text generation from deployed language models, apart from any protocol: the REST generate
// routes and the gRPC GenerationService call it, so both answer alike. A request is checked and
// given one of --max_generations places (Start) before anything is sent, then runs (Run),
// handing each token to the caller as it is chosen.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/generation.h"
#include "server/serving/model_repository.h"

namespace kiln::serving {

struct GenerationOptions {
  // Generations running at once in this kilnd, over all models; one more is RESOURCE_EXHAUSTED.
  int max_generations = 4;
  // The longest one generation runs; then it ends after the token at hand (finish "stop").
  absl::Duration max_duration = absl::Minutes(5);
};

// What to generate from: a model, a version (empty: the default), and a prompt as text (encoded
// with the checkpoint's vocabulary) or as token ids (a model without a vocabulary takes only
// these), exactly one of the two.
struct GenerationCall {
  std::string model, version;
  std::optional<std::string> text_input;
  std::optional<std::vector<int64_t>> input_ids;
  GenerationParams params;
};

// One generated token: its id and, when the model has a vocabulary, its text.
struct GeneratedToken {
  int32_t id = 0;
  std::string text;
};

struct GenerationResult {
  std::string model, version;
  std::string text;          // the tokens' text (empty without a vocabulary)
  std::vector<int32_t> ids;  // the tokens, without the prompt
  // "length": max_tokens were generated; "stop": it ended before (on_token said stop, or the
  // generation ran max_duration).
  std::string finish_reason;
};

class GenerationService;

// A checked generation holding its place; gives the place back when destroyed.
class Generation {
 public:
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  const ServedVersion& version() const { return *version_; }
  bool has_vocabulary() const { return version_->language_model()->vocabulary() != nullptr; }
  // Generates, calling on_token with each token as it is chosen (returning false stops there).
  // Once only. Waits for the version's model to be free (one stream at a time on it).
  absl::StatusOr<GenerationResult> Run(const std::function<bool(const GeneratedToken&)>& on_token);

 private:
  friend class GenerationService;
  Generation(GenerationService* service, std::shared_ptr<const ServedVersion> version,
             std::vector<int32_t> prompt, GenerationParams params)
      : service_(service),
        version_(std::move(version)),
        prompt_(std::move(prompt)),
        params_(params) {}

  GenerationService* service_;
  std::shared_ptr<const ServedVersion> version_;
  std::vector<int32_t> prompt_;
  GenerationParams params_;
};

// Thread-safe.
class GenerationService {
 public:
  // `repository` must outlive the service and every Generation it starts.
  GenerationService(ModelRepository* repository, GenerationOptions options = {});

  // Finds the version, encodes the prompt, checks the parameters (CheckGeneration) and takes a
  // place. InvalidArgument naming the field at fault ("text_input: character 'é' at ..."), or
  // "model \"m\" is not a language model"; NotFound / Unavailable as ModelRepository::Find;
  // RESOURCE_EXHAUSTED when max_generations are running.
  absl::StatusOr<std::unique_ptr<Generation>> Start(const server::Caller& caller,
                                                    const GenerationCall& call);

  int running() const { return running_.load(); }
  const GenerationOptions& options() const { return options_; }

 private:
  friend class Generation;
  ModelRepository* repository_;
  const GenerationOptions options_;
  std::atomic<int> running_{0};
};

}  // namespace kiln::serving
