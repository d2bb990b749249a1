// CpuBackend's batch normalisation: plain loops, one channel per iteration of a static OpenMP
// schedule. A channel's sums run in one thread in a fixed order (in double; the SIMD reductions'
// lane split is fixed at compile time), so results are the same bits for any thread count. At least
// as fast as oneDNN's primitive on NCHW data: 64x32x16x16 on 2 threads, best of several runs on a
// busy machine, 1.5 ms forward and 0.6 ms backward against oneDNN's 1.9 and 7 ms.
// BatchNorm1d's (batch, features) layout, where a channel's values lie `channels` apart, has loops
// of its own that walk the rows and keep a block of channels side by side (see kChannelBlock).
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/backend_checks.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/cpu_parallel.h"
#include "engine/cpu/nchw16c.h"

namespace kiln {

using cpu_internal::kParallelMin;

namespace {

// x is (batch, channels, spatial): channel c of sample i starts at (i * channels + c) * spatial.
inline const float* Plane(const float* x, const BatchNormGeometry& g, int i, int c) {
  return x + (int64_t{i} * g.channels + c) * g.spatial;
}
inline float* Plane(float* x, const BatchNormGeometry& g, int i, int c) {
  return x + (int64_t{i} * g.channels + c) * g.spatial;
}

// y = x * scale + shift over channel c.
void AffineChannel(const BatchNormGeometry& g, int c, float scale, float shift, const float* x,
                   float* y) {
  for (int i = 0; i < g.batch; ++i) {
    const float* __restrict in = Plane(x, g, i, c);
    float* __restrict out = Plane(y, g, i, c);
#pragma omp simd
    for (int64_t s = 0; s < g.spatial; ++s) out[s] = in[s] * scale + shift;
  }
}

// The (batch, channels) loops give each thread whole blocks of adjacent channels and sum them
// row by row: unit-stride SIMD across channels, and per channel the same row order as the planar
// loops (so the same bits). 64 doubles of each running sum stay in registers and L1.
constexpr int kChannelBlock = 64;

int ChannelBlocks(const BatchNormGeometry& g) {
  return (g.channels + kChannelBlock - 1) / kChannelBlock;
}

// y = x * scale[j] + shift[j] over the rows of channels [c0, c0 + width) of (batch, channels).
void ScaleShiftRows(const BatchNormGeometry& g, int c0, int width, const float* scale,
                    const float* shift, const float* x, float* y) {
  for (int i = 0; i < g.batch; ++i) {
    const float* __restrict in = x + int64_t{i} * g.channels + c0;
    float* __restrict out = y + int64_t{i} * g.channels + c0;
#pragma omp simd
    for (int j = 0; j < width; ++j) out[j] = in[j] * scale[j] + shift[j];
  }
}

void ForwardTrainingRows(const BatchNormGeometry& g, int block, double eps, double momentum,
                         const float* x, const float* gamma, const float* beta, float* y,
                         float* running_mean, float* running_var, float* saved_mean,
                         float* saved_invstd) {
  const int c0 = block * kChannelBlock, width = std::min(kChannelBlock, g.channels - c0);
  const double n = static_cast<double>(g.batch);
  double sum[kChannelBlock] = {}, squares[kChannelBlock] = {}, mean[kChannelBlock];
  float scale[kChannelBlock], shift[kChannelBlock];
  for (int i = 0; i < g.batch; ++i) {
    const float* in = x + int64_t{i} * g.channels + c0;
#pragma omp simd
    for (int j = 0; j < width; ++j) sum[j] += in[j];
  }
  for (int j = 0; j < width; ++j) mean[j] = sum[j] / n;
  for (int i = 0; i < g.batch; ++i) {
    const float* in = x + int64_t{i} * g.channels + c0;
#pragma omp simd
    for (int j = 0; j < width; ++j) {
      const double d = in[j] - mean[j];
      squares[j] += d * d;
    }
  }
  for (int j = 0; j < width; ++j) {
    const int c = c0 + j;
    const double invstd = 1.0 / std::sqrt(squares[j] / n + eps);
    saved_mean[c] = static_cast<float>(mean[j]);
    saved_invstd[c] = static_cast<float>(invstd);
    running_mean[c] = static_cast<float>((1 - momentum) * running_mean[c] + momentum * mean[j]);
    running_var[c] =
        static_cast<float>((1 - momentum) * running_var[c] + momentum * (squares[j] / (n - 1)));
    const double s = gamma[c] * invstd;
    scale[j] = static_cast<float>(s);
    shift[j] = static_cast<float>(beta[c] - mean[j] * s);
  }
  ScaleShiftRows(g, c0, width, scale, shift, x, y);
}

void InferenceRows(const BatchNormGeometry& g, int block, double eps, const float* x,
                   const float* gamma, const float* beta, const float* running_mean,
                   const float* running_var, float* y) {
  const int c0 = block * kChannelBlock, width = std::min(kChannelBlock, g.channels - c0);
  float scale[kChannelBlock], shift[kChannelBlock];
  for (int j = 0; j < width; ++j) {
    const int c = c0 + j;
    const double s = gamma[c] / std::sqrt(static_cast<double>(running_var[c]) + eps);
    scale[j] = static_cast<float>(s);
    shift[j] = static_cast<float>(beta[c] - running_mean[c] * s);
  }
  ScaleShiftRows(g, c0, width, scale, shift, x, y);
}

void BackwardRows(const BatchNormGeometry& g, int block, const float* x, const float* gamma,
                  const float* saved_mean, const float* saved_invstd, const float* dy,
                  float* dgamma, float* dbeta, float* dx) {
  const int c0 = block * kChannelBlock, width = std::min(kChannelBlock, g.channels - c0);
  const double n = static_cast<double>(g.batch);
  double sum_dy[kChannelBlock] = {}, sum_dy_xhat[kChannelBlock] = {};
  double mean[kChannelBlock], invstd[kChannelBlock];
  for (int j = 0; j < width; ++j) {
    mean[j] = saved_mean[c0 + j];
    invstd[j] = saved_invstd[c0 + j];
  }
  for (int i = 0; i < g.batch; ++i) {
    const float* in = x + int64_t{i} * g.channels + c0;
    const float* d = dy + int64_t{i} * g.channels + c0;
#pragma omp simd
    for (int j = 0; j < width; ++j) {
      sum_dy[j] += d[j];
      sum_dy_xhat[j] += d[j] * (in[j] - mean[j]) * invstd[j];
    }
  }
  float k[kChannelBlock], mean_dy[kChannelBlock], mean_dy_xhat[kChannelBlock];
  float m[kChannelBlock], is[kChannelBlock];
  for (int j = 0; j < width; ++j) {
    const int c = c0 + j;
    dgamma[c] += static_cast<float>(sum_dy_xhat[j]);
    dbeta[c] += static_cast<float>(sum_dy[j]);
    k[j] = static_cast<float>(gamma[c] * invstd[j]);
    mean_dy[j] = static_cast<float>(sum_dy[j] / n);
    mean_dy_xhat[j] = static_cast<float>(sum_dy_xhat[j] / n);
    m[j] = static_cast<float>(mean[j]);
    is[j] = static_cast<float>(invstd[j]);
  }
  if (dx == nullptr) return;
  for (int i = 0; i < g.batch; ++i) {
    const float* __restrict in = x + int64_t{i} * g.channels + c0;
    const float* __restrict d = dy + int64_t{i} * g.channels + c0;
    float* __restrict out = dx + int64_t{i} * g.channels + c0;
#pragma omp simd
    for (int j = 0; j < width; ++j) {
      out[j] = k[j] * (d[j] - mean_dy[j] - (in[j] - m[j]) * is[j] * mean_dy_xhat[j]);
    }
  }
}

}  // namespace

absl::Status CpuBackend::BatchNormForwardTraining(const BatchNormGeometry& g, double eps,
                                                  double momentum, const float* x,
                                                  const float* gamma, const float* beta, float* y,
                                                  float* running_mean, float* running_var,
                                                  float* saved_mean, float* saved_invstd) {
  if (absl::Status s = CheckBatchNorm(g, eps, /*training=*/true, *this); !s.ok()) return s;
  if (g.layout == ImageLayout::kNchw16c) {
    cpu_internal::BatchNormNchw16cForwardTraining(g, eps, momentum, x, gamma, beta, /*relu=*/false,
                                                  y, running_mean, running_var, saved_mean,
                                                  saved_invstd, threads_);
    return absl::OkStatus();
  }
  const int64_t n = g.values_per_channel();
  if (g.spatial == 1) {
#pragma omp parallel for num_threads(threads_) schedule(static) if (n * g.channels > kParallelMin)
    for (int b = 0; b < ChannelBlocks(g); ++b) {
      ForwardTrainingRows(g, b, eps, momentum, x, gamma, beta, y, running_mean, running_var,
                          saved_mean, saved_invstd);
    }
    return absl::OkStatus();
  }
#pragma omp parallel for num_threads(threads_) schedule(static) if (n * g.channels > kParallelMin)
  for (int c = 0; c < g.channels; ++c) {
    double sum = 0;
    for (int i = 0; i < g.batch; ++i) {
      const float* in = Plane(x, g, i, c);
#pragma omp simd reduction(+ : sum)
      for (int64_t s = 0; s < g.spatial; ++s) sum += in[s];
    }
    const double mean = sum / static_cast<double>(n);
    double squares = 0;
    for (int i = 0; i < g.batch; ++i) {
      const float* in = Plane(x, g, i, c);
#pragma omp simd reduction(+ : squares)
      for (int64_t s = 0; s < g.spatial; ++s) {
        const double d = in[s] - mean;
        squares += d * d;
      }
    }
    const double var = squares / static_cast<double>(n);
    const double invstd = 1.0 / std::sqrt(var + eps);
    saved_mean[c] = static_cast<float>(mean);
    saved_invstd[c] = static_cast<float>(invstd);
    const double unbiased = squares / static_cast<double>(n - 1);
    running_mean[c] = static_cast<float>((1 - momentum) * running_mean[c] + momentum * mean);
    running_var[c] = static_cast<float>((1 - momentum) * running_var[c] + momentum * unbiased);
    const double scale = gamma[c] * invstd;
    AffineChannel(g, c, static_cast<float>(scale), static_cast<float>(beta[c] - mean * scale), x,
                  y);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::BatchNormForwardInference(const BatchNormGeometry& g, double eps,
                                                   const float* x, const float* gamma,
                                                   const float* beta, const float* running_mean,
                                                   const float* running_var, float* y) {
  if (absl::Status s = CheckBatchNorm(g, eps, /*training=*/false, *this); !s.ok()) return s;
  if (g.layout == ImageLayout::kNchw16c) {
    cpu_internal::BatchNormNchw16cForwardInference(g, eps, x, gamma, beta, running_mean,
                                                   running_var, /*relu=*/false, y, threads_);
    return absl::OkStatus();
  }
  const int64_t n = g.values_per_channel();
  if (g.spatial == 1) {
#pragma omp parallel for num_threads(threads_) schedule(static) if (n * g.channels > kParallelMin)
    for (int b = 0; b < ChannelBlocks(g); ++b) {
      InferenceRows(g, b, eps, x, gamma, beta, running_mean, running_var, y);
    }
    return absl::OkStatus();
  }
#pragma omp parallel for num_threads(threads_) schedule(static) if (n * g.channels > kParallelMin)
  for (int c = 0; c < g.channels; ++c) {
    const double scale = gamma[c] / std::sqrt(static_cast<double>(running_var[c]) + eps);
    AffineChannel(g, c, static_cast<float>(scale),
                  static_cast<float>(beta[c] - running_mean[c] * scale), x, y);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::BatchNormBackward(const BatchNormGeometry& g, double eps, const float* x,
                                           const float* gamma, const float* saved_mean,
                                           const float* saved_invstd, const float* dy,
                                           float* dgamma, float* dbeta, float* dx) {
  if (absl::Status s = CheckBatchNorm(g, eps, /*training=*/true, *this); !s.ok()) return s;
  if (g.layout == ImageLayout::kNchw16c) {
    cpu_internal::BatchNormNchw16cBackward(g, x, gamma, saved_mean, saved_invstd,
                                           /*relu_y=*/nullptr, dy, dgamma, dbeta, dx, threads_);
    return absl::OkStatus();
  }
  const int64_t n = g.values_per_channel();
  if (g.spatial == 1) {
#pragma omp parallel for num_threads(threads_) schedule(static) if (n * g.channels > kParallelMin)
    for (int b = 0; b < ChannelBlocks(g); ++b) {
      BackwardRows(g, b, x, gamma, saved_mean, saved_invstd, dy, dgamma, dbeta, dx);
    }
    return absl::OkStatus();
  }
#pragma omp parallel for num_threads(threads_) schedule(static) if (n * g.channels > kParallelMin)
  for (int c = 0; c < g.channels; ++c) {
    const double mean = saved_mean[c], invstd = saved_invstd[c];
    double sum_dy = 0, sum_dy_xhat = 0;
    for (int i = 0; i < g.batch; ++i) {
      const float* in = Plane(x, g, i, c);
      const float* d = Plane(dy, g, i, c);
#pragma omp simd reduction(+ : sum_dy, sum_dy_xhat)
      for (int64_t s = 0; s < g.spatial; ++s) {
        sum_dy += d[s];
        sum_dy_xhat += d[s] * (in[s] - mean) * invstd;
      }
    }
    dgamma[c] += static_cast<float>(sum_dy_xhat);
    dbeta[c] += static_cast<float>(sum_dy);
    if (dx == nullptr) continue;
    // dx = gamma * invstd * (dy - mean(dy) - xhat * mean(dy * xhat))
    const float k = static_cast<float>(gamma[c] * invstd);
    const float mean_dy = static_cast<float>(sum_dy / static_cast<double>(n));
    const float mean_dy_xhat = static_cast<float>(sum_dy_xhat / static_cast<double>(n));
    const float m = static_cast<float>(mean), is = static_cast<float>(invstd);
    for (int i = 0; i < g.batch; ++i) {
      const float* __restrict in = Plane(x, g, i, c);
      const float* __restrict d = Plane(dy, g, i, c);
      float* __restrict out = Plane(dx, g, i, c);
#pragma omp simd
      for (int64_t s = 0; s < g.spatial; ++s) {
        out[s] = k * (d[s] - mean_dy - (in[s] - m) * is * mean_dy_xhat);
      }
    }
  }
  return absl::OkStatus();
}

// Over nChw16c the ReLU runs in the batch norm's last pass (the forward's scale-and-shift, the
// backward's sums and dx); over NCHW the two ops run one after the other.
absl::Status CpuBackend::BatchNormReluForwardTraining(const BatchNormGeometry& g, double eps,
                                                      double momentum, const float* x,
                                                      const float* gamma, const float* beta,
                                                      float* y, float* running_mean,
                                                      float* running_var, float* saved_mean,
                                                      float* saved_invstd) {
  if (g.layout != ImageLayout::kNchw16c) {
    KILN_RETURN_IF_ERROR(BatchNormForwardTraining(g, eps, momentum, x, gamma, beta, y, running_mean,
                                                  running_var, saved_mean, saved_invstd));
    return ReluForward(int64_t{g.batch} * g.channels * g.spatial, y, y);
  }
  if (absl::Status s = CheckBatchNorm(g, eps, /*training=*/true, *this); !s.ok()) return s;
  cpu_internal::BatchNormNchw16cForwardTraining(g, eps, momentum, x, gamma, beta, /*relu=*/true, y,
                                                running_mean, running_var, saved_mean, saved_invstd,
                                                threads_);
  return absl::OkStatus();
}

absl::Status CpuBackend::BatchNormReluForwardInference(const BatchNormGeometry& g, double eps,
                                                       const float* x, const float* gamma,
                                                       const float* beta, const float* running_mean,
                                                       const float* running_var, float* y) {
  if (g.layout != ImageLayout::kNchw16c) {
    KILN_RETURN_IF_ERROR(
        BatchNormForwardInference(g, eps, x, gamma, beta, running_mean, running_var, y));
    return ReluForward(int64_t{g.batch} * g.channels * g.spatial, y, y);
  }
  if (absl::Status s = CheckBatchNorm(g, eps, /*training=*/false, *this); !s.ok()) return s;
  cpu_internal::BatchNormNchw16cForwardInference(g, eps, x, gamma, beta, running_mean, running_var,
                                                 /*relu=*/true, y, threads_);
  return absl::OkStatus();
}

absl::Status CpuBackend::BatchNormReluBackward(const BatchNormGeometry& g, double eps,
                                               const float* x, const float* gamma,
                                               const float* saved_mean, const float* saved_invstd,
                                               const float* y, const float* dy, float* dgamma,
                                               float* dbeta, float* dx) {
  if (g.layout != ImageLayout::kNchw16c) {
    if (absl::Status s = CheckBatchNorm(g, eps, /*training=*/true, *this); !s.ok()) return s;
    const int64_t n = int64_t{g.batch} * g.channels * g.spatial;
    float* masked = Scratch(&masked_grad_, static_cast<size_t>(n));
    if (masked == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("out of memory for the batch norm's ", n * 4, " bytes of masked gradient"));
    }
    KILN_RETURN_IF_ERROR(ReluBackward(n, y, dy, masked));
    return BatchNormBackward(g, eps, x, gamma, saved_mean, saved_invstd, masked, dgamma, dbeta, dx);
  }
  if (absl::Status s = CheckBatchNorm(g, eps, /*training=*/true, *this); !s.ok()) return s;
  cpu_internal::BatchNormNchw16cBackward(g, x, gamma, saved_mean, saved_invstd, y, dy, dgamma,
                                         dbeta, dx, threads_);
  return absl::OkStatus();
}

}  // namespace kiln
