// Losses over a batch of model outputs (rows, classes) and int32 labels: cross-entropy fused with
// log-softmax, and mean squared error against one-hot labels. Both count correct predictions.
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"

namespace kiln {

enum class LossKind { kCrossEntropy, kMeanSquaredError };

const char* LossName(LossKind kind);

class Loss {
 public:
  // label_smoothing (cross-entropy only, in [0, 1]) as PyTorch's CrossEntropyLoss takes it.
  Loss(LossKind kind, Backend* backend, float label_smoothing = 0)
      : kind_(kind), backend_(backend), label_smoothing_(label_smoothing) {}

  // out is (rows, classes), or (B, T, classes) with B * T labels (a language model's logits
  // against a target per position: rows are then the B * T positions). Writes the mean loss to
  // the device scalar *loss and the number of rows whose argmax is the label to *correct; dout
  // (shaped like out) when not null.
  absl::Status Compute(const Tensor& out, const Tensor& labels, float* loss, int32_t* correct,
                       Tensor* dout);

 private:
  LossKind kind_;
  Backend* backend_;
  float label_smoothing_;
  Tensor onehot_;  // MSE targets, grown to the largest batch
};

}  // namespace kiln
