// CpuBackend's element-wise ops: ReLU and leaky ReLU (loops), tanh, sigmoid, GELU and SiLU
// (oneDNN eltwise, dnnl_eltwise_cache), dropout (counter-based masks, as on CUDA), softmax, add,
// and the strided copy of concat.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/activation_math.h"
#include "engine/backend_checks.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/cpu_parallel.h"
#include "engine/cpu/dnnl_primitives.h"
#include "engine/rng.h"

namespace kiln {

using cpu_internal::kParallelMin;

namespace am = activation_math;

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

absl::Status CpuBackend::ActivationForward(ActivationKind kind, float param, int64_t n,
                                           const float* x, float* y) {
  if (cpu_internal::DnnlEltwiseCache::Handles(kind)) {
    return dnnl_->eltwise().Forward(dnnl_->stream(), kind, n, x, y);
  }
  if (kind != ActivationKind::kLeakyRelu) {
    return absl::InvalidArgumentError(
        absl::StrCat("activation forward: unknown kind ", static_cast<int>(kind)));
  }
  // Leaky ReLU, a select: vectorised as ReLU is, no faster on oneDNN.
#pragma omp parallel for simd num_threads(threads_) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = am::LeakyReluForward(x[i], param);
  return absl::OkStatus();
}

absl::Status CpuBackend::ActivationBackward(ActivationKind kind, float param, int64_t n,
                                            const float* x, const float* y, const float* dy,
                                            float* dx) {
  if (cpu_internal::DnnlEltwiseCache::Handles(kind)) {
    return dnnl_->eltwise().Backward(dnnl_->stream(), kind, n, x, y, dy, dx);
  }
  if (kind != ActivationKind::kLeakyRelu) {
    return absl::InvalidArgumentError(
        absl::StrCat("activation backward: unknown kind ", static_cast<int>(kind)));
  }
#pragma omp parallel for simd num_threads(threads_) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float d = dy[i];
    dx[i] = am::LeakyReluBackward(x[i], param, d);
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

absl::Status CpuBackend::Add(int64_t n, const float* a, const float* b, float* y) {
#pragma omp parallel for simd num_threads(threads_) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
  return absl::OkStatus();
}

absl::Status CpuBackend::Scale(int64_t n, float alpha, float* x) {
#pragma omp parallel for simd num_threads(threads_) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
  return absl::OkStatus();
}

absl::Status CpuBackend::Copy2D(int64_t rows, int64_t cols, const float* src, int64_t src_stride,
                                float* dst, int64_t dst_stride) {
  KILN_RETURN_IF_ERROR(CheckCopy2D(rows, cols, src_stride, dst_stride));
  if (rows == 0 || cols == 0) return absl::OkStatus();
#pragma omp parallel for num_threads(threads_) if (rows * cols > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + r * dst_stride, src + r * src_stride, static_cast<size_t>(cols) * 4);
  }
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
