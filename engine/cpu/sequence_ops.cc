// CpuBackend's sequence ops (transformers): layer normalisation, embeddings, the strided batched
// GEMM, the causal softmax and Transpose0213. Every op is the same bits for any thread count:
// rows (and matrices) are independent, and the two reductions over rows (LayerNorm's dgamma and
// dbeta, the embedding's scatter) give each column to one thread, which sums the rows in order.
// - LayerNorm: one row per iteration; the statistics in double over two passes (the variance
//   about the mean, exact for rows far from zero), y in float.
// - The batched GEMM: one oneDNN 3-D matmul primitive per shape and strides (brgemm with AVX-512
//   on this machine), about twice as fast on attention's shapes as OpenBLAS's sgemm per matrix
//   in an OpenMP loop (48 x 64x64x32, 1 thread: 0.065 against 0.14 ms).
// - The causal softmax: only the i+1 live values of row i are read and exponentiated, with a
//   polynomial exp that GCC vectorises (glibc's expf is a call per value); the masked rest is
//   zero-filled.
// - Transpose0213: memcpy of d-float runs, parallel over (a, the longer of b and c).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/backend_checks.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/cpu_parallel.h"
#include "engine/cpu/dnnl_matmul_cache.h"
#include "engine/cpu/dnnl_primitives.h"

namespace kiln {

using cpu_internal::kParallelMin;

namespace {

// --- layer normalisation -------------------------------------------------------------------------

// One row of x(rows, cols): its mean and rstd, then y = xhat * gamma + beta (either may be null:
// no scale, no shift). y may be x.
void LayerNormRow(int cols, float eps, const float* x, const float* gamma, const float* beta,
                  float* y, float* mean_out, float* rstd_out) {
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int c = 0; c < cols; ++c) sum += x[c];
  const double mean = sum / cols;
  double squares = 0;
#pragma omp simd reduction(+ : squares)
  for (int c = 0; c < cols; ++c) {
    const double d = x[c] - mean;
    squares += d * d;
  }
  const float m = static_cast<float>(mean);
  const float r = static_cast<float>(1.0 / std::sqrt(squares / cols + eps));
  *mean_out = m;
  *rstd_out = r;
  if (gamma != nullptr && beta != nullptr) {
#pragma omp simd
    for (int c = 0; c < cols; ++c) y[c] = (x[c] - m) * r * gamma[c] + beta[c];
    return;
  }
  if (gamma != nullptr) {
#pragma omp simd
    for (int c = 0; c < cols; ++c) y[c] = (x[c] - m) * r * gamma[c];
    return;
  }
#pragma omp simd
  for (int c = 0; c < cols; ++c) y[c] = (x[c] - m) * r;
  if (beta != nullptr) {
#pragma omp simd
    for (int c = 0; c < cols; ++c) y[c] += beta[c];
  }
}

// dx of one row: with g = dy * gamma (dy without gamma) and xhat = (x - mean) * rstd,
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), the means in double. dx may be dy.
void LayerNormBackwardRow(int cols, const float* x, const float* gamma, float mean, float rstd,
                          const float* dy, float* dx) {
  double sum_g = 0, sum_gx = 0;
  if (gamma != nullptr) {
#pragma omp simd reduction(+ : sum_g, sum_gx)
    for (int c = 0; c < cols; ++c) {
      const float g = dy[c] * gamma[c];
      sum_g += g;
      sum_gx += static_cast<double>(g) * ((x[c] - mean) * rstd);
    }
  } else {
#pragma omp simd reduction(+ : sum_g, sum_gx)
    for (int c = 0; c < cols; ++c) {
      sum_g += dy[c];
      sum_gx += static_cast<double>(dy[c]) * ((x[c] - mean) * rstd);
    }
  }
  const float mean_g = static_cast<float>(sum_g / cols);
  const float mean_gx = static_cast<float>(sum_gx / cols);
  if (gamma != nullptr) {
#pragma omp simd
    for (int c = 0; c < cols; ++c) {
      const float xhat = (x[c] - mean) * rstd;
      dx[c] = rstd * (dy[c] * gamma[c] - mean_g - xhat * mean_gx);
    }
  } else {
#pragma omp simd
    for (int c = 0; c < cols; ++c) {
      const float xhat = (x[c] - mean) * rstd;
      dx[c] = rstd * (dy[c] - mean_g - xhat * mean_gx);
    }
  }
}

// The widest column block LayerNorm's parameter gradients keep in registers and L1.
constexpr int kColumnBlock = 64;

// dgamma[c] += sum over rows of dy * xhat and dbeta[c] += sum over rows of dy for the columns
// [c0, c0 + width) (either output may be null), each column summed over the rows in order in
// double: the same bits however the columns are split.
void LayerNormParamGradColumns(int64_t rows, int cols, int c0, int width, const float* x,
                               const float* mean, const float* rstd, const float* dy, float* dgamma,
                               float* dbeta) {
  double sum_dyx[kColumnBlock] = {}, sum_dy[kColumnBlock] = {};
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols + c0;
    const float* dyr = dy + r * cols + c0;
    const float m = mean[r], s = rstd[r];
#pragma omp simd
    for (int j = 0; j < width; ++j) {
      sum_dyx[j] += static_cast<double>(dyr[j]) * ((xr[j] - m) * s);
      sum_dy[j] += dyr[j];
    }
  }
  for (int j = 0; j < width; ++j) {
    if (dgamma != nullptr) dgamma[c0 + j] += static_cast<float>(sum_dyx[j]);
    if (dbeta != nullptr) dbeta[c0 + j] += static_cast<float>(sum_dy[j]);
  }
}

// --- causal softmax ------------------------------------------------------------------------------

// e^x for x <= 0, within 1.1 ulp (Cephes' expf: x = n ln 2 + r with |r| <= ln 2 / 2, a degree-7
// polynomial for e^r, 2^n built in the exponent bits); 0 below -87.3, where e^x leaves float's
// normal range. All arithmetic and a select, so loops over it vectorise (this file is compiled
// with -fno-trapping-math for that), where glibc's expf is a call per value. NaN stays NaN.
inline float ExpNonPositive(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  const float n = std::floor(x * kLog2e + 0.5f);
  const float r = x - n * kLn2Hi - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // n is in [-126, 0] wherever the result is kept, so 2^n is a normal float.
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return x < -87.3f ? 0.0f : p * two_n;
}

// Row i of one (t, t) matrix: y[j] = softmax over j <= i of scale * x[j], 0 above the diagonal.
// y may be x.
void CausalSoftmaxRow(int t, int i, float scale, const float* x, float* y) {
  const int live = i + 1;
  float mx = x[0];
#pragma omp simd reduction(max : mx)
  for (int j = 0; j < live; ++j) mx = x[j] > mx ? x[j] : mx;
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < live; ++j) {
    const float e = ExpNonPositive((x[j] - mx) * scale);
    y[j] = e;
    sum += e;
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int j = 0; j < live; ++j) y[j] *= inv;
  std::fill(y + live, y + t, 0.0f);
}

// Row i of one (t, t) matrix: dx[j] = scale * y[j] * (dy[j] - sum over j' <= i of dy * y), 0 above
// the diagonal. dx may be dy.
void CausalSoftmaxBackwardRow(int t, int i, float scale, const float* y, const float* dy,
                              float* dx) {
  const int live = i + 1;
  float dot = 0;
#pragma omp simd reduction(+ : dot)
  for (int j = 0; j < live; ++j) dot += dy[j] * y[j];
#pragma omp simd
  for (int j = 0; j < live; ++j) dx[j] = scale * y[j] * (dy[j] - dot);
  std::fill(dx + live, dx + t, 0.0f);
}

// Runs of fewer floats than this are copied by a loop: memcpy's call costs more.
constexpr int64_t kMemcpyMin = 16;

// `count` runs of d floats, the i-th from in + i * in_stride to out + i * out_stride.
void CopyRuns(int64_t count, int64_t d, const float* in, int64_t in_stride, float* out,
              int64_t out_stride) {
  if (d < kMemcpyMin) {
    for (int64_t i = 0; i < count; ++i) {
      for (int64_t e = 0; e < d; ++e) out[i * out_stride + e] = in[i * in_stride + e];
    }
    return;
  }
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(out + i * out_stride, in + i * in_stride, static_cast<size_t>(d) * sizeof(float));
  }
}

}  // namespace

absl::Status CpuBackend::LayerNormForward(int64_t rows, int cols, float eps, const float* x,
                                          const float* gamma, const float* beta, float* y,
                                          float* mean, float* rstd) {
  KILN_RETURN_IF_ERROR(CheckLayerNorm(rows, cols, eps));
#pragma omp parallel for num_threads(threads_) schedule(static) if (rows * cols > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    LayerNormRow(cols, eps, x + r * cols, gamma, beta, y + r * cols, mean + r, rstd + r);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::LayerNormBackward(int64_t rows, int cols, const float* x,
                                           const float* gamma, const float* mean, const float* rstd,
                                           const float* dy, float* dx, float* dgamma,
                                           float* dbeta) {
  KILN_RETURN_IF_ERROR(CheckLayerNorm(rows, cols, /*eps=*/1.0f));  // eps is the forward's alone
  const bool parallel = rows * cols > kParallelMin;
  if (dx != nullptr) {
#pragma omp parallel for num_threads(threads_) schedule(static) if (parallel)
    for (int64_t r = 0; r < rows; ++r) {
      LayerNormBackwardRow(cols, x + r * cols, gamma, mean[r], rstd[r], dy + r * cols,
                           dx + r * cols);
    }
  }
  if (dgamma == nullptr && dbeta == nullptr) return absl::OkStatus();
  // Column blocks, as many as there are threads where the row allows it, a cache line (16
  // floats) at least: the block width changes no bits.
  const int per_thread = (cols + threads_ - 1) / threads_;
  const int width = std::clamp((per_thread + 15) / 16 * 16, 16, kColumnBlock);
  const int blocks = (cols + width - 1) / width;
#pragma omp parallel for num_threads(threads_) schedule(static) if (parallel && blocks > 1)
  for (int block = 0; block < blocks; ++block) {
    const int c0 = block * width;
    LayerNormParamGradColumns(rows, cols, c0, std::min(width, cols - c0), x, mean, rstd, dy, dgamma,
                              dbeta);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::EmbeddingForward(int64_t count, int vocab, int dim, const int32_t* ids,
                                          const float* table, float* y) {
  KILN_RETURN_IF_ERROR(CheckEmbedding(count, vocab, dim));
  // Every id is checked before anything is written.
  for (int64_t i = 0; i < count; ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("embedding forward: id ", ids[i],
                                                     " at position ", i, " is outside the table's ",
                                                     vocab, " rows"));
    }
  }
#pragma omp parallel for num_threads(threads_) schedule(static) if (count * dim > kParallelMin)
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(y + i * dim, table + int64_t{ids[i]} * dim, static_cast<size_t>(dim) * 4);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::EmbeddingBackward(int64_t count, int vocab, int dim, const int32_t* ids,
                                           const float* dy, float* dtable) {
  KILN_RETURN_IF_ERROR(CheckEmbedding(count, vocab, dim));
  // Each thread owns a range of columns (whole cache lines of 16 floats) and adds every dy row
  // into its part of the table in index order: each value's sum runs in the same order however
  // the columns are split, without atomics.
  const int lines = (dim + 15) / 16;
  const int teams = count * dim > kParallelMin ? std::min(threads_, lines) : 1;
#pragma omp parallel num_threads(teams) if (teams > 1)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int c0 = std::min(dim, lines * t / nt * 16);
    const int c1 = std::min(dim, lines * (t + 1) / nt * 16);
    for (int64_t i = 0; i < count; ++i) {
      const int32_t id = ids[i];
      if (id < 0 || id >= vocab) continue;
      const float* in = dy + i * dim;
      float* out = dtable + int64_t{id} * dim;
#pragma omp simd
      for (int c = c0; c < c1; ++c) out[c] += in[c];
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::GemmStridedBatched(Transpose ta, Transpose tb, int m, int n, int k,
                                            float alpha, const float* a, int64_t stride_a,
                                            const float* b, int64_t stride_b, float beta, float* c,
                                            int64_t stride_c, int batch) {
  KILN_RETURN_IF_ERROR(CheckGemmStridedBatched(m, n, k, stride_a, stride_b, stride_c, batch));
  if (batch == 0 || m == 0 || n == 0) return absl::OkStatus();
  if (batch == 1) return Gemm(ta, tb, m, n, k, alpha, a, b, beta, c);
  if (k > 0 && cpu_internal::DnnlMatmulCache::Batchable(m, n, k, stride_a, stride_b)) {
    return dnnl_->matmuls().RunBatched(dnnl_->stream(), ta, tb, m, n, k, alpha, a, stride_a, b,
                                       stride_b, beta, c, stride_c, batch);
  }
  // Operands that overlap (0 < stride < their size), and empty products
  // (C = beta * C): one GEMM per matrix.
  for (int i = 0; i < batch; ++i) {
    absl::Status s =
        Gemm(ta, tb, m, n, k, alpha, a + i * stride_a, b + i * stride_b, beta, c + i * stride_c);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("batched GEMM, matrix ", i, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::CausalSoftmaxForward(int64_t batch, int t, float scale, const float* x,
                                              float* y) {
  KILN_RETURN_IF_ERROR(CheckCausalSoftmax(batch, t, scale));
  const int64_t rows = batch * t;
  // Row i costs i + 1: contiguous blocks of rows still balance, as each covers whole matrices or
  // the same share of each.
#pragma omp parallel for num_threads(threads_) schedule(static) if (rows * t > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    CausalSoftmaxRow(t, static_cast<int>(r % t), scale, x + r * t, y + r * t);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::CausalSoftmaxForwardAt(int64_t batch, int queries, int keys, int offset,
                                                float scale, const float* x, float* y) {
  KILN_RETURN_IF_ERROR(CheckCausalSoftmaxAt(batch, queries, keys, offset, scale));
  const int64_t rows = batch * queries;
#pragma omp parallel for num_threads(threads_) schedule(static) if (rows * keys > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    CausalSoftmaxRow(keys, offset + static_cast<int>(r % queries), scale, x + r * keys,
                     y + r * keys);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::CausalSoftmaxBackward(int64_t batch, int t, float scale, const float* y,
                                               const float* dy, float* dx) {
  KILN_RETURN_IF_ERROR(CheckCausalSoftmax(batch, t, scale));
  const int64_t rows = batch * t;
#pragma omp parallel for num_threads(threads_) schedule(static) if (rows * t > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    CausalSoftmaxBackwardRow(t, static_cast<int>(r % t), scale, y + r * t, dy + r * t, dx + r * t);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Transpose0213(int64_t a, int64_t b, int64_t c, int64_t d, const float* x,
                                       float* y) {
  KILN_RETURN_IF_ERROR(CheckTranspose0213(a, b, c, d));
  const bool parallel = a * b * c * d > kParallelMin;
  if (b >= c) {
    // One x(ia, ib) slab of c runs read in order, scattered b * d apart into y.
#pragma omp parallel for collapse(2) num_threads(threads_) schedule(static) if (parallel)
    for (int64_t ia = 0; ia < a; ++ia) {
      for (int64_t ib = 0; ib < b; ++ib) {
        CopyRuns(c, d, x + (ia * b + ib) * c * d, d, y + (ia * c * b + ib) * d, b * d);
      }
    }
    return absl::OkStatus();
  }
  // One y(ia, ic) slab of b runs written in order, gathered c * d apart from x.
#pragma omp parallel for collapse(2) num_threads(threads_) schedule(static) if (parallel)
  for (int64_t ia = 0; ia < a; ++ia) {
    for (int64_t ic = 0; ic < c; ++ic) {
      CopyRuns(b, d, x + (ia * b * c + ic) * d, c * d, y + (ia * c + ic) * b * d, d);
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln
