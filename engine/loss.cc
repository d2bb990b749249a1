#include "engine/loss.h"

#include "common/status_macros.h"

namespace kiln {

const char* LossName(LossKind kind) {
  return kind == LossKind::kCrossEntropy ? "cross_entropy" : "mse";
}

absl::Status Loss::Compute(const Tensor& out, const Tensor& labels, float* loss, int32_t* correct,
                           Tensor* dout) {
  // A row per label: a classifier's out (B, classes) has one per sample; a sequence model's
  // out (B, T, vocab) with B * T labels one per position, so the loss is the mean over every
  // position (PyTorch's cross_entropy of logits.view(-1, vocab)) and `correct` counts positions.
  int64_t rows64 = out.dim(0);
  if (out.rank() == 3 && labels.numel() != rows64 && labels.numel() == out.dim(0) * out.dim(1)) {
    rows64 = labels.numel();
  }
  const int rows = static_cast<int>(rows64);
  const int cols = static_cast<int>(out.numel() / rows64);
  if (kind_ == LossKind::kCrossEntropy) {
    return backend_->SoftmaxCrossEntropy(rows, cols, out.f32(), labels.i32(), label_smoothing_,
                                         loss, correct, dout ? dout->f32() : nullptr);
  }
  if (!onehot_.Reshape(out.shape())) {
    KILN_ASSIGN_OR_RETURN(onehot_, backend_->Allocate(DType::kF32, out.shape()));
  }
  KILN_RETURN_IF_ERROR(backend_->OneHot(rows, cols, labels.i32(), onehot_.f32()));
  KILN_RETURN_IF_ERROR(backend_->MeanSquaredError(out.numel(), out.f32(), onehot_.f32(), loss,
                                                  dout ? dout->f32() : nullptr));
  return backend_->CountCorrect(rows, cols, out.f32(), labels.i32(), correct);
}

}  // namespace kiln
