#include "server/serving/generation_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kiln::serving {
namespace {

absl::Status Prefixed(const ServedVersion& version, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat("model \"", version.model(), "\" version \"", version.version(),
                                   "\": ", std::string(status.message())));
}

// The prompt's ids: text encoded with the vocabulary, or ids as given (checked by
// CheckGeneration against the model's ids).
absl::StatusOr<std::vector<int32_t>> PromptOf(const GenerationCall& call, const LanguageModel& lm) {
  if (call.text_input.has_value() == call.input_ids.has_value()) {
    return absl::InvalidArgumentError(
        "give the prompt as exactly one of text_input (text) and input_ids (token ids)");
  }
  if (call.text_input) {
    if (lm.vocabulary() == nullptr) {
      return absl::InvalidArgumentError(
          "text_input: the model has no vocabulary (it was trained on token shards); send "
          "input_ids instead");
    }
    absl::StatusOr<std::vector<int32_t>> ids = lm.vocabulary()->Encode(*call.text_input);
    if (!ids.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("text_input: ", ids.status().message()));
    }
    return ids;
  }
  std::vector<int32_t> ids;
  ids.reserve(call.input_ids->size());
  for (size_t i = 0; i < call.input_ids->size(); ++i) {
    const int64_t id = (*call.input_ids)[i];
    if (id < 0 || id >= lm.shape().token_ids) {
      return absl::InvalidArgumentError(absl::StrCat("input_ids[", i, "]: token id ", id,
                                                     " is outside the vocabulary [0, ",
                                                     lm.shape().token_ids, ")"));
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

}  // namespace

GenerationService::GenerationService(ModelRepository* repository, GenerationOptions options)
    : repository_(repository), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<Generation>> GenerationService::Start(const server::Caller& caller,
                                                                     const GenerationCall& call) {
  if (call.model.empty()) return absl::InvalidArgumentError("model_name: required");
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<const ServedVersion> version,
                        repository_->FindFor(caller, call.model, call.version));
  LanguageModel* lm = version->language_model();
  if (lm == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("model \"", call.model,
                     "\" is not a language model: generation needs a sequence model "
                     "(a GPT); use infer"));
  }
  absl::StatusOr<std::vector<int32_t>> prompt = PromptOf(call, *lm);
  if (!prompt.ok()) return Prefixed(*version, prompt.status());
  GenerationParams params = call.params;
  params.use_kv_cache = true;
  if (absl::Status checked = CheckGeneration(lm->config(), *prompt, params).status();
      !checked.ok()) {
    return Prefixed(*version, checked);
  }
  // A place is taken only when free: never more than max_generations, even for a moment.
  int running = running_.load();
  do {
    if (running >= options_.max_generations) {
      return absl::ResourceExhaustedError(
          absl::StrCat("kilnd is running ", running, " generations, its limit (--max_generations ",
                       options_.max_generations, "); try again later"));
    }
  } while (!running_.compare_exchange_weak(running, running + 1));
  return std::unique_ptr<Generation>(
      new Generation(this, std::move(version), std::move(*prompt), params));
}

Generation::~Generation() { service_->running_.fetch_sub(1); }

absl::StatusOr<GenerationResult> Generation::Run(
    const std::function<bool(const GeneratedToken&)>& on_token) {
  LanguageModel& lm = *version_->language_model();
  const CharVocabulary* vocabulary = lm.vocabulary();
  const absl::Time deadline = absl::Now() + service_->options_.max_duration;
  GenerationResult result;
  result.model = version_->model();
  result.version = version_->version();
  absl::Status decode_error;
  auto each = [&](int32_t id) {
    GeneratedToken token{id, ""};
    if (vocabulary != nullptr) {
      absl::StatusOr<std::string> text = vocabulary->Decode(std::span<const int32_t>(&id, 1));
      if (!text.ok()) {
        decode_error = text.status();
        return false;
      }
      token.text = std::move(*text);
    }
    result.text += token.text;
    return (!on_token || on_token(token)) && absl::Now() < deadline;
  };
  absl::StatusOr<std::vector<int32_t>> ids = lm.Generate(prompt_, params_, each);
  if (!ids.ok()) return Prefixed(*version_, ids.status());
  // A token the vocabulary cannot spell (a model of more logits than characters) is the model's
  // fault, not the client's.
  if (!decode_error.ok()) {
    return Prefixed(*version_,
                    absl::DataLossError(absl::StrCat("generated a token outside the vocabulary: ",
                                                     decode_error.message())));
  }
  result.ids = std::move(*ids);
  result.finish_reason =
      static_cast<int64_t>(result.ids.size()) >= params_.max_tokens ? "length" : "stop";
  return result;
}

}  // namespace kiln::serving
