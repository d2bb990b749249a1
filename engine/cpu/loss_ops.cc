// CpuBackend's losses and the ops that score predictions: softmax cross-entropy, mean squared
// error, one-hot, argmax, count-correct.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/backend_checks.h"
#include "engine/cpu/cpu_backend.h"

namespace kiln {

absl::Status CpuBackend::SoftmaxCrossEntropy(int rows, int cols, const float* logits,
                                             const int32_t* labels, float label_smoothing,
                                             float* loss, int32_t* correct, float* dlogits) {
  if (absl::Status s = CheckSoftmaxCrossEntropy(rows, cols, label_smoothing); !s.ok()) return s;
  double total = 0;
  int32_t hits = 0;
  const float inv_rows = 1.0f / static_cast<float>(rows);
  // The target is (1 - e) on the label plus e / cols everywhere; e = 0 leaves every term exact.
  const float on_label = 1.0f - label_smoothing;
  const float spread = label_smoothing / static_cast<float>(cols);
  for (int r = 0; r < rows; ++r) {
    const float* z = logits + static_cast<int64_t>(r) * cols;
    const int label = labels[r];
    if (label < 0 || label >= cols) {
      return absl::InvalidArgumentError(
          absl::StrCat("label ", label, " out of range for ", cols, " classes"));
    }
    int best = 0;
    for (int c = 1; c < cols; ++c) {
      if (z[c] > z[best]) best = c;
    }
    const float mx = z[best];
    float sum = 0;
    for (int c = 0; c < cols; ++c) sum += std::exp(z[c] - mx);
    const float log_sum = std::log(sum);
    float smoothed = 0;  // sum over classes of -log p_c, times e / cols
    if (label_smoothing > 0.0f) {
      for (int c = 0; c < cols; ++c) smoothed += log_sum - (z[c] - mx);
      smoothed *= spread;
    }
    const float nll = log_sum - (z[label] - mx);
    total += static_cast<double>(on_label * nll + smoothed);
    hits += best == label;
    if (dlogits != nullptr) {
      float* d = dlogits + static_cast<int64_t>(r) * cols;
      const float inv_sum = 1.0f / sum;
      for (int c = 0; c < cols; ++c) d[c] = std::exp(z[c] - mx) * inv_sum * inv_rows;
      if (label_smoothing > 0.0f) {
        const float spread_grad = spread * inv_rows;
        for (int c = 0; c < cols; ++c) d[c] -= spread_grad;
      }
      d[label] -= on_label * inv_rows;
    }
  }
  *loss = static_cast<float>(total / rows);
  *correct = hits;
  return absl::OkStatus();
}

absl::Status CpuBackend::MeanSquaredError(int64_t n, const float* y, const float* target,
                                          float* loss, float* dy) {
  double total = 0;
  const float scale = 2.0f / static_cast<float>(n);
  for (int64_t i = 0; i < n; ++i) {
    const float d = y[i] - target[i];
    total += static_cast<double>(d) * d;
    if (dy != nullptr) dy[i] = scale * d;
  }
  *loss = static_cast<float>(total / static_cast<double>(n));
  return absl::OkStatus();
}

absl::Status CpuBackend::OneHot(int rows, int cols, const int32_t* labels, float* onehot) {
  std::fill_n(onehot, static_cast<int64_t>(rows) * cols, 0.0f);
  for (int r = 0; r < rows; ++r) {
    if (labels[r] < 0 || labels[r] >= cols) {
      return absl::InvalidArgumentError(
          absl::StrCat("label ", labels[r], " out of range for ", cols, " classes"));
    }
    onehot[static_cast<int64_t>(r) * cols + labels[r]] = 1.0f;
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Argmax(int rows, int cols, const float* x, int32_t* out) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * cols;
    out[r] = static_cast<int32_t>(std::max_element(xr, xr + cols) - xr);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::CountCorrect(int rows, int cols, const float* x, const int32_t* labels,
                                      int32_t* correct) {
  int32_t hits = 0;
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * cols;
    hits += (std::max_element(xr, xr + cols) - xr) == labels[r];
  }
  *correct = hits;
  return absl::OkStatus();
}

}  // namespace kiln
