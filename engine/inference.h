// Forward-only sessions for serving: a model loaded from a checkpoint, run on batches of raw
// pixels with the normalisation it was trained with, answering probabilities and classes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/model.h"

namespace kiln {

class InferenceSession {
 public:
  // Builds the model the checkpoint describes (CheckpointInfo) on `backend`, loads its weights and
  // takes its normalisation. Buffers for up to max_batch samples are allocated here, so
  // requests allocate nothing.
  static absl::StatusOr<std::unique_ptr<InferenceSession>> FromCheckpoint(
      const std::string& path, Backend* backend, int max_batch);

  const ModelConfig& config() const { return model_->config(); }
  const Shape& input_shape() const { return model_->config().input_shape; }
  int64_t input_elems() const { return NumElements(input_shape()); }
  int64_t num_classes() const { return model_->output_shape()[0]; }
  int max_batch() const { return max_batch_; }
  const PixelNorm& norm() const { return norm_; }

  // Raw pixels 0..255, batch x input_elems, sample-major. Writes softmax probabilities
  // (batch x classes) and the argmax class per sample. Not thread-safe: one caller at a time.
  absl::Status PredictU8(const uint8_t* pixels, int batch, float* probs, int32_t* classes);
  // Pixels already scaled to [0, 1] (x / 255, the FP32 convention of the serving API).
  absl::Status PredictF32(const float* pixels01, int batch, float* probs, int32_t* classes);

 private:
  InferenceSession(std::unique_ptr<Model> model, Backend* backend, PixelNorm norm, int max_batch)
      : model_(std::move(model)), backend_(backend), norm_(norm), max_batch_(max_batch) {}
  absl::Status Allocate();
  absl::Status Run(int batch, float* probs, int32_t* classes);

  std::unique_ptr<Model> model_;
  Backend* backend_;
  PixelNorm norm_;
  int max_batch_;
  bool outputs_probabilities_ = false;  // the model ends in a softmax layer
  std::vector<float> host_x_;           // normalised inputs, staged for the copy to the device
  Tensor x_, probs_, classes_;
};

}  // namespace kiln
