// Forward-only sessions for serving: a model loaded from a checkpoint, run on batches of raw
// pixels with the normalisation it was trained with, answering probabilities and classes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/model/model.h"
#include "engine/pixel_norm.h"

namespace kiln {

class InferenceSession {
 public:
  // Builds the model the checkpoint describes (CheckpointInfo) on `backend`, loads its weights and
  // takes its normalisation. Buffers for up to max_batch samples are allocated here, so
  // requests allocate nothing.
  static absl::StatusOr<std::unique_ptr<InferenceSession>> FromCheckpoint(const std::string& path,
                                                                          Backend* backend,
                                                                          int max_batch);

  const ModelConfig& config() const { return model_->config(); }
  const Shape& input_shape() const { return model_->config().input_shape; }
  int64_t input_elems() const { return NumElements(input_shape()); }
  int64_t num_classes() const { return model_->output_shape()[0]; }
  int max_batch() const { return max_batch_; }
  const PixelNorm& norm() const { return norm_; }

  // One batch of inputs, sample-major: `u8_rows` samples of raw pixels 0..255, then `f32_rows`
  // samples already scaled to [0, 1] (x / 255, the FP32 convention of the serving API).
  struct Rows {
    const uint8_t* u8 = nullptr;
    int u8_rows = 0;
    const float* f32 = nullptr;
    int f32_rows = 0;
  };
  // Runs `rows` as one batch: each form is normalised on the device with the training
  // normalisation (GatherNormalize, Normalize), then one forward pass. Writes softmax
  // probabilities (batch x classes) and the argmax class per sample, u8 rows first. Float inputs
  // are not checked here (callers refuse non-finite ones first, as the serving codec does); a
  // non-finite output, whatever its cause, is DATA_LOSS, never an answer. Not thread-safe: one
  // caller at a time.
  absl::Status Predict(const Rows& rows, float* probs, int32_t* classes);
  // All rows of one form. PredictF32 refuses a non-finite input (InvalidArgument).
  absl::Status PredictU8(const uint8_t* pixels, int batch, float* probs, int32_t* classes);
  absl::Status PredictF32(const float* pixels01, int batch, float* probs, int32_t* classes);

 private:
  InferenceSession(std::unique_ptr<Model> model, Backend* backend, PixelNorm norm, int max_batch)
      : model_(std::move(model)), backend_(backend), norm_(norm), max_batch_(max_batch) {}
  absl::Status Allocate();

  std::unique_ptr<Model> model_;
  Backend* backend_;
  PixelNorm norm_;
  int max_batch_;
  bool outputs_probabilities_ = false;  // the model ends in a softmax layer
  bool weights_finite_ = true;          // every parameter as loaded is finite
  FoldedNorm f32_fold_;  // norm_ for FP32 inputs (x / 255 for pixels), as PredictF32 checks it
  // Device buffers for max_batch samples: raw uint8 and float inputs as they arrive, the
  // identity index GatherNormalize reads them through, the normalised model input, the outputs.
  Tensor u8_, f32_, index_, x_, probs_, classes_;
};

}  // namespace kiln
