// CpuBackend's element-wise ops: ReLU, the other activations, dropout (counter-based masks, as on
// CUDA), softmax.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/activation_math.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/cpu_parallel.h"
#include "engine/rng.h"

namespace kiln {

using cpu_internal::kParallelMin;

namespace am = activation_math;

namespace {

// out[i] = f(i) over n elements on `threads` threads; one loop per activation, so the formula
// inlines into it.
template <typename F>
void ForEach(int threads, int64_t n, float* out, F f) {
#pragma omp parallel for simd num_threads(threads) if (n > kParallelMin / 8)
  for (int64_t i = 0; i < n; ++i) out[i] = f(i);
}

}  // namespace

absl::Status CpuBackend::ActivationForward(ActivationKind kind, float param, int64_t n,
                                           const float* x, float* y) {
  switch (kind) {
    case ActivationKind::kTanh:
      ForEach(threads_, n, y, [x](int64_t i) { return am::TanhForward(x[i]); });
      return absl::OkStatus();
    case ActivationKind::kSigmoid:
      ForEach(threads_, n, y, [x](int64_t i) { return am::SigmoidForward(x[i]); });
      return absl::OkStatus();
    case ActivationKind::kGelu:
      ForEach(threads_, n, y, [x](int64_t i) { return am::GeluForward(x[i]); });
      return absl::OkStatus();
    case ActivationKind::kLeakyRelu:
      ForEach(threads_, n, y, [x, param](int64_t i) { return am::LeakyReluForward(x[i], param); });
      return absl::OkStatus();
    case ActivationKind::kSilu:
      ForEach(threads_, n, y, [x](int64_t i) { return am::SiluForward(x[i]); });
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("activation forward: unknown kind ", static_cast<int>(kind)));
}

absl::Status CpuBackend::ActivationBackward(ActivationKind kind, float param, int64_t n,
                                            const float* x, const float* y, const float* dy,
                                            float* dx) {
  switch (kind) {
    case ActivationKind::kTanh:
      ForEach(threads_, n, dx, [y, dy](int64_t i) { return am::TanhBackward(y[i], dy[i]); });
      return absl::OkStatus();
    case ActivationKind::kSigmoid:
      ForEach(threads_, n, dx, [y, dy](int64_t i) { return am::SigmoidBackward(y[i], dy[i]); });
      return absl::OkStatus();
    case ActivationKind::kGelu:
      ForEach(threads_, n, dx, [x, dy](int64_t i) { return am::GeluBackward(x[i], dy[i]); });
      return absl::OkStatus();
    case ActivationKind::kLeakyRelu:
      ForEach(threads_, n, dx,
              [x, dy, param](int64_t i) { return am::LeakyReluBackward(x[i], param, dy[i]); });
      return absl::OkStatus();
    case ActivationKind::kSilu:
      ForEach(threads_, n, dx, [x, dy](int64_t i) { return am::SiluBackward(x[i], dy[i]); });
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("activation backward: unknown kind ", static_cast<int>(kind)));
}

absl::Status CpuBackend::ReluForward(int64_t n, const float* x, float* y) {
#pragma omp parallel for simd num_threads(threads_) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  return absl::OkStatus();
}

absl::Status CpuBackend::ReluBackward(int64_t n, const float* y, const float* dy, float* dx) {
  // Both loads unconditional, so the select vectorises instead of branching on random signs.
#pragma omp parallel for simd num_threads(threads_) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float d = dy[i];
    dx[i] = y[i] > 0.0f ? d : 0.0f;
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::DropoutForward(int64_t n, float p, uint64_t seed, uint64_t offset,
                                        const float* x, float* mask, float* y) {
  const float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
#pragma omp parallel for num_threads(threads_) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    mask[i] = CounterUniform(seed, offset + i) >= p ? keep_scale : 0.0f;
    y[i] = x[i] * mask[i];
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::DropoutBackward(int64_t n, const float* mask, const float* dy, float* dx) {
#pragma omp parallel for simd num_threads(threads_) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * mask[i];
  return absl::OkStatus();
}

absl::Status CpuBackend::SoftmaxForward(int rows, int cols, const float* x, float* y) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * cols;
    float* yr = y + static_cast<int64_t>(r) * cols;
    const float mx = *std::max_element(xr, xr + cols);
    float sum = 0;
    for (int c = 0; c < cols; ++c) sum += (yr[c] = std::exp(xr[c] - mx));
    const float inv = 1.0f / sum;
    for (int c = 0; c < cols; ++c) yr[c] *= inv;
  }
  return absl::OkStatus();
}

}  // namespace kiln
