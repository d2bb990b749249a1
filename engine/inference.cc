#include "engine/inference.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <variant>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "engine/model/checkpoint.h"
#include "engine/model/model_config_json.h"

namespace kiln {

absl::StatusOr<std::unique_ptr<InferenceSession>> InferenceSession::FromCheckpoint(
    const std::string& path, Backend* backend, int max_batch) {
  if (max_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_batch must be >= 1, got ", max_batch));
  }
  KILN_ASSIGN_OR_RETURN(CheckpointInfo info, ReadCheckpointInfo(path));
  const ModelConfig& config = info.model;
  const PixelNorm& norm = info.norm;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Build(config, backend, 0));
  if (model->output_shape().size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": the model's output is ",
                                                   ShapeString(model->output_shape()),
                                                   "; serving needs a flat output"));
  }
  KILN_RETURN_IF_ERROR(ReadCheckpoint(path, *model, nullptr, nullptr));
  // Whether a non-finite answer later is the weights' fault or the input's.
  bool weights_finite = true;
  std::vector<float> host;
  for (const NamedParameter& p : model->parameters()) {
    host.resize(static_cast<size_t>(p.param->value.bytes() / sizeof(float)));
    KILN_RETURN_IF_ERROR(backend->CopyToHost(p.param->value, host.data(), p.param->value.bytes()));
    weights_finite = weights_finite && std::all_of(host.begin(), host.end(),
                                                   [](float v) { return std::isfinite(v); });
  }
  auto session = std::unique_ptr<InferenceSession>(
      new InferenceSession(std::move(model), backend, norm, max_batch));
  session->weights_finite_ = weights_finite;
  session->outputs_probabilities_ = std::holds_alternative<SoftmaxConfig>(config.layers.back());
  KILN_RETURN_IF_ERROR(session->Allocate());
  return session;
}

absl::Status InferenceSession::Allocate() {
  // Once per session: every FP32 request's range check uses it.
  KILN_ASSIGN_OR_RETURN(
      f32_fold_,
      FoldPixelNorm(norm_, input_elems(), norm_.input == NormInput::kPixels ? 255.0f : 1.0f));
  Shape xs = input_shape();
  xs.insert(xs.begin(), max_batch_);
  KILN_ASSIGN_OR_RETURN(u8_, backend_->Allocate(DType::kU8, xs));
  KILN_ASSIGN_OR_RETURN(f32_, backend_->Allocate(DType::kF32, xs));
  KILN_ASSIGN_OR_RETURN(x_, backend_->Allocate(DType::kF32, xs));
  KILN_ASSIGN_OR_RETURN(probs_, backend_->Allocate(DType::kF32, {max_batch_, num_classes()}));
  KILN_ASSIGN_OR_RETURN(classes_, backend_->Allocate(DType::kI32, {max_batch_}));
  KILN_ASSIGN_OR_RETURN(index_, backend_->Allocate(DType::kI32, {max_batch_}));
  std::vector<int32_t> identity(max_batch_);
  for (int i = 0; i < max_batch_; ++i) identity[i] = i;
  KILN_RETURN_IF_ERROR(backend_->CopyFromHost(identity.data(), index_.bytes(), &index_));
  // One forward at full size now (of zero pixels), so the model's activations exist before the
  // first request.
  if (norm_.input == NormInput::kFeatures) {
    std::vector<float> zeros(static_cast<size_t>(max_batch_) * input_elems());
    return Predict({nullptr, 0, zeros.data(), max_batch_}, nullptr, nullptr);
  }
  std::vector<uint8_t> zeros(static_cast<size_t>(max_batch_) * input_elems());
  return Predict({zeros.data(), max_batch_, nullptr, 0}, nullptr, nullptr);
}

absl::Status InferenceSession::PredictU8(const uint8_t* pixels, int batch, float* probs,
                                         int32_t* classes) {
  return Predict({pixels, batch, nullptr, 0}, probs, classes);
}

absl::Status InferenceSession::PredictF32(const float* pixels01, int batch, float* probs,
                                          int32_t* classes) {
  const int64_t elems = input_elems();
  const int64_t n = static_cast<int64_t>(std::max(batch, 0)) * elems;
  // The model sees a * x + b per channel (Predict's normalisation); a finite x that this takes
  // past float32's range is the request's fault, said here rather than as a broken answer.
  const FoldedNorm& fold = f32_fold_;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(pixels01[i])) {
      return absl::InvalidArgumentError(absl::StrCat("input element ", i, " is not finite"));
    }
    const int64_t channel = fold.plane > 0 ? (i % elems) / fold.plane : 0;
    if (!std::isfinite(pixels01[i] * fold.a[channel] + fold.b[channel])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample ", i / elems, ": input element ", i % elems, " (", pixels01[i],
          ") is too large: the model's input normalisation takes it past float32's range"));
    }
  }
  return Predict({nullptr, 0, pixels01, batch}, probs, classes);
}

absl::Status InferenceSession::Predict(const Rows& rows, float* probs, int32_t* classes) {
  const int batch = rows.u8_rows + rows.f32_rows;
  if (rows.u8_rows < 0 || rows.f32_rows < 0 || batch < 1 || batch > max_batch_) {
    return absl::InvalidArgumentError(absl::StrCat("batch ", batch, " is outside 1..", max_batch_));
  }
  const int64_t elems = input_elems();
  if (rows.u8_rows > 0 && norm_.input == NormInput::kFeatures) {
    return absl::InvalidArgumentError(
        "this model was trained on float features (a table): send FP32 inputs, not UINT8");
  }
  if (rows.u8_rows > 0) {
    KILN_RETURN_IF_ERROR(backend_->CopyFromHost(rows.u8, rows.u8_rows * elems, &u8_));
    KILN_RETURN_IF_ERROR(backend_->GatherNormalize(rows.u8_rows, elems, index_.i32(), u8_.u8(),
                                                   nullptr, norm_, x_.f32(), nullptr));
  }
  if (rows.f32_rows > 0) {
    const int64_t n = rows.f32_rows * elems;
    KILN_RETURN_IF_ERROR(backend_->CopyFromHost(rows.f32, n * sizeof(float), &f32_));
    // [0, 1] is pixel / 255: the same normalisation with a 255 times larger scale. Features
    // are taken as they are.
    PixelNorm scaled = norm_;
    if (norm_.input == NormInput::kPixels) scaled.scale *= 255.0f;
    KILN_RETURN_IF_ERROR(backend_->Normalize(rows.f32_rows, elems, f32_.f32(), scaled,
                                             x_.f32() + rows.u8_rows * elems));
  }
  Shape xs = input_shape();
  xs.insert(xs.begin(), batch);
  x_.Reshape(xs);
  KILN_ASSIGN_OR_RETURN(const Tensor* out, model_->Forward(x_, Mode::kEval));
  const int cols = static_cast<int>(num_classes());
  const float* p = out->f32();
  if (!outputs_probabilities_) {
    KILN_RETURN_IF_ERROR(backend_->SoftmaxForward(batch, cols, out->f32(), probs_.f32()));
    p = probs_.f32();
  }
  KILN_RETURN_IF_ERROR(backend_->Argmax(batch, cols, p, classes_.i32()));
  if (probs != nullptr) {
    Tensor view = outputs_probabilities_ ? *out : probs_;
    KILN_RETURN_IF_ERROR(backend_->CopyToHost(view, probs, sizeof(float) * batch * cols));
    // A non-finite probability is never an answer: the weights' fault where they are not
    // finite (a diverged or damaged checkpoint), else the input's (values too large for float32
    // arithmetic inside the model).
    for (int64_t i = 0; i < int64_t{batch} * cols; ++i) {
      if (std::isfinite(probs[i])) continue;
      if (!weights_finite_) {
        return absl::DataLossError(
            absl::StrCat("the model answered a non-finite probability for sample ", i / cols,
                         ": its weights are not finite (a diverged or damaged checkpoint)"));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "sample ", i / cols,
          ": the model's output is not finite for this input (its values are too large for "
          "float32 arithmetic inside the model)"));
    }
  }
  if (classes != nullptr) {
    KILN_RETURN_IF_ERROR(backend_->CopyToHost(classes_, classes, sizeof(int32_t) * batch));
  }
  return absl::OkStatus();
}

}  // namespace kiln
