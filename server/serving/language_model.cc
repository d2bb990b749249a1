#include "server/serving/language_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/model/checkpoint.h"

namespace kiln::serving {

absl::StatusOr<std::unique_ptr<LanguageModel>> LanguageModel::FromCheckpoint(
    const std::string& path, Backend* backend, int max_batch) {
  if (max_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_batch must be >= 1, got ", max_batch));
  }
  KILN_ASSIGN_OR_RETURN(CheckpointInfo info, ReadCheckpointInfo(path));
  auto lm = std::unique_ptr<LanguageModel>(new LanguageModel());
  KILN_ASSIGN_OR_RETURN(lm->shape_, SequenceModelShapeOf(info.model));
  if (!info.vocabulary.empty()) {
    KILN_ASSIGN_OR_RETURN(CharVocabulary vocabulary,
                          CharVocabulary::FromJson(info.vocabulary, path + ": kiln.vocabulary"));
    lm->vocabulary_ = std::move(vocabulary);
  }
  lm->max_batch_ = max_batch;
  lm->backend_ = backend;
  backend->BindCallingThread();
  KILN_ASSIGN_OR_RETURN(lm->model_, Model::Build(info.model, backend, 0));
  KILN_RETURN_IF_ERROR(lm->model_->CheckIncremental());
  KILN_RETURN_IF_ERROR(ReadCheckpoint(path, *lm->model_, nullptr, nullptr));
  return lm;
}

absl::Status LanguageModel::LastLogits(const std::vector<int32_t>& ids, int64_t batch,
                                       int64_t length, float* logits) {
  const int64_t t = shape_.context, vocab = shape_.vocab;
  if (length < 1 || length > t || static_cast<int64_t>(ids.size()) != batch * length) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompts of ", length, " ids; the model takes 1..", t));
  }
  std::lock_guard<std::mutex> lock(mu_);
  backend_->BindCallingThread();
  std::vector<int32_t> padded;
  std::vector<float> out;
  for (int64_t first = 0; first < batch; first += max_batch_) {
    const int64_t n = std::min<int64_t>(max_batch_, batch - first);
    padded.assign(static_cast<size_t>(n * t), 0);
    for (int64_t b = 0; b < n; ++b) {
      std::copy_n(ids.begin() + (first + b) * length, length, padded.begin() + b * t);
    }
    KILN_ASSIGN_OR_RETURN(Tensor x, backend_->Allocate(DType::kI32, {n, t}));
    KILN_RETURN_IF_ERROR(backend_->CopyFromHost(padded.data(), padded.size() * 4, &x));
    KILN_ASSIGN_OR_RETURN(const Tensor* y, model_->Forward(x, Mode::kEval));
    out.resize(static_cast<size_t>(n * t * vocab));
    KILN_RETURN_IF_ERROR(backend_->CopyToHost(*y, out.data(), out.size() * sizeof(float)));
    for (float v : out) {
      if (!std::isfinite(v)) {
        return absl::DataLossError("the model's logits are not finite (bad weights?)");
      }
    }
    for (int64_t b = 0; b < n; ++b) {
      std::memcpy(logits + (first + b) * vocab, out.data() + (b * t + length - 1) * vocab,
                  static_cast<size_t>(vocab) * sizeof(float));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> LanguageModel::Generate(const std::vector<int32_t>& prompt,
                                                             const GenerationParams& params,
                                                             const TokenCallback& on_token) {
  std::lock_guard<std::mutex> lock(mu_);
  backend_->BindCallingThread();
  return kiln::Generate(model_.get(), prompt, params, on_token);
}

}  // namespace kiln::serving
