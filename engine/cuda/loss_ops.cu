// CudaBackend's losses with their kernels: fused softmax cross-entropy (forward and backward in
// one pass, with the correct count), mean squared error, one-hot targets, row argmax and accuracy
// counting. Reductions run in
// a fixed order, in double where the CPU sums in double, so every run gives the same bits.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "engine/backend_checks.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cuda_kernels.h"
#include "engine/cuda/device_math.cuh"

namespace kiln::cuda_kernels {

namespace {

constexpr int kRowsPerBlock = kThreads / kWarp;  // one warp per row

__device__ void ReportBadLabel(KernelErrorRecord* error, KernelOp op, int label, int cols) {
  if (atomicCAS(&error->code, kNoKernelError, kLabelOutOfRange) == kNoKernelError) {
    error->op = op;
    error->value = label;
    error->limit = cols;
  }
}

// logits(rows, cols) -> per-row loss and hit, and dlogits; the mean is taken by xent_mean_kernel.
__global__ void softmax_xent_rows_kernel(int rows, int cols, const float* logits,
                                         const int32_t* labels, float label_smoothing,
                                         float inv_rows, float* dlogits, float* row_loss,
                                         int32_t* row_hit, KernelErrorRecord* error) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const float* z = logits + static_cast<int64_t>(row) * cols;
  float* d = dlogits != nullptr ? dlogits + static_cast<int64_t>(row) * cols : nullptr;
  const int label = labels[row];
  if (label < 0 || label >= cols) {
    if (lane == 0) {
      ReportBadLabel(error, kOpSoftmaxCrossEntropy, label, cols);
      row_loss[row] = nanf("");
      row_hit[row] = 0;
    }
    if (d != nullptr) {
      for (int c = lane; c < cols; c += kWarp) d[c] = 0.0f;
    }
    return;
  }
  const int best = WarpRowArgmax(z, cols, lane);
  const float mx = z[best];
  float sum = 0.0f;
  for (int c = lane; c < cols; c += kWarp) sum += expf(z[c] - mx);
  sum = WarpSum(sum);
  const float log_sum = logf(sum);
  // The target is (1 - e) on the label plus e / cols everywhere; e = 0 leaves every term exact.
  const float on_label = 1.0f - label_smoothing;
  const float spread = label_smoothing / static_cast<float>(cols);
  float smoothed = 0.0f;  // sum over classes of -log p_c, times e / cols
  if (label_smoothing > 0.0f) {
    for (int c = lane; c < cols; c += kWarp) smoothed += log_sum - (z[c] - mx);
    smoothed = WarpSum(smoothed) * spread;
  }
  if (lane == 0) {
    row_loss[row] = on_label * (log_sum - (z[label] - mx)) + smoothed;
    row_hit[row] = best == label ? 1 : 0;
  }
  if (d != nullptr) {
    const float inv_sum = 1.0f / sum;
    const float spread_grad = spread * inv_rows;
    for (int c = lane; c < cols; c += kWarp) {
      float v = expf(z[c] - mx) * inv_sum * inv_rows;
      if (label_smoothing > 0.0f) v -= spread_grad;
      if (c == label) v -= on_label * inv_rows;
      d[c] = v;
    }
  }
}

// One block: loss[0] = (sum of row losses in double) / rows, correct[0] = sum of hits.
__global__ void xent_mean_kernel(int rows, const float* row_loss, const int32_t* row_hit,
                                 float* loss, int32_t* correct) {
  double total = 0.0;
  int32_t hits = 0;
  for (int r = threadIdx.x; r < rows; r += kThreads) {
    total += static_cast<double>(row_loss[r]);
    hits += row_hit[r];
  }
  total = BlockSum(total);
  hits = BlockSum(hits);
  if (threadIdx.x == 0) {
    loss[0] = static_cast<float>(total / rows);
    correct[0] = hits;
  }
}

__global__ void mse_partial_kernel(int64_t n, const float* y, const float* target, float scale,
                                   float* dy, double* partial) {
  double total = 0.0;
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float d = y[i] - target[i];
    total += static_cast<double>(d) * d;
    if (dy != nullptr) dy[i] = scale * d;
  }
  total = BlockSum(total);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

__global__ void mse_mean_kernel(int blocks, const double* partial, int64_t n, float* loss) {
  double total = 0.0;
  for (int b = threadIdx.x; b < blocks; b += kThreads) total += partial[b];
  total = BlockSum(total);
  if (threadIdx.x == 0) loss[0] = static_cast<float>(total / static_cast<double>(n));
}

__global__ void one_hot_kernel(int64_t n, int cols, const int32_t* labels, float* onehot,
                               KernelErrorRecord* error) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const int64_t r = i / cols;
    const int c = static_cast<int>(i - r * cols);
    const int label = labels[r];
    if (c == 0 && (label < 0 || label >= cols)) ReportBadLabel(error, kOpOneHot, label, cols);
    onehot[i] = c == label ? 1.0f : 0.0f;
  }
}

__global__ void argmax_rows_kernel(int rows, int cols, const float* x, int32_t* out) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const int best = WarpRowArgmax(x + static_cast<int64_t>(row) * cols, cols, lane);
  if (lane == 0) out[row] = best;
}

__global__ void count_correct_kernel(int rows, int cols, const float* x, const int32_t* labels,
                                     int32_t* correct) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const int best = WarpRowArgmax(x + static_cast<int64_t>(row) * cols, cols, lane);
  // Integer addition commutes exactly: the count is the same whatever order the rows land in.
  if (lane == 0 && best == labels[row]) atomicAdd(correct, 1);
}

unsigned RowBlocks(int rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

// Fused log-softmax cross-entropy over logits(rows, cols): loss[0] = mean row loss (summed in
// double, in a fixed order), correct[0] = rows whose first maximum is the label, dlogits =
// (softmax - target) / rows when not null, the target smoothed as Backend::SoftmaxCrossEntropy
// says. scratch holds 8 * rows bytes.
cudaError_t softmax_xent(cudaStream_t stream, int rows, int cols, const float* logits,
                         const int32_t* labels, float label_smoothing, float* loss,
                         int32_t* correct, float* dlogits, void* scratch,
                         KernelErrorRecord* error) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  float* row_loss = static_cast<float*>(scratch);
  int32_t* row_hit = reinterpret_cast<int32_t*>(row_loss + rows);
  softmax_xent_rows_kernel<<<RowBlocks(rows), kThreads, 0, stream>>>(
      rows, cols, logits, labels, label_smoothing, 1.0f / static_cast<float>(rows), dlogits,
      row_loss, row_hit, error);
  const cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess) return rc;
  xent_mean_kernel<<<1, kThreads, 0, stream>>>(rows, row_loss, row_hit, loss, correct);
  return cudaGetLastError();
}

// Bytes of scratch mean_squared_error needs.
int64_t mean_squared_error_scratch_bytes(int64_t n) {
  return static_cast<int64_t>(GridFor(n)) * static_cast<int64_t>(sizeof(double));
}

// loss[0] = mean of (y - target)^2 (summed in double, fixed order); dy = 2 (y - target) / n
// when not null.
cudaError_t mean_squared_error(cudaStream_t stream, int64_t n, const float* y, const float* target,
                               float* loss, float* dy, void* scratch) {
  if (n <= 0) return cudaSuccess;
  // The grid depends on n alone, so the partial sums and their order are fixed.
  const unsigned blocks = GridFor(n);
  double* partial = static_cast<double*>(scratch);
  mse_partial_kernel<<<blocks, kThreads, 0, stream>>>(n, y, target, 2.0f / static_cast<float>(n),
                                                      dy, partial);
  const cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess) return rc;
  mse_mean_kernel<<<1, kThreads, 0, stream>>>(static_cast<int>(blocks), partial, n, loss);
  return cudaGetLastError();
}

cudaError_t one_hot(cudaStream_t stream, int rows, int cols, const int32_t* labels, float* onehot,
                    KernelErrorRecord* error) {
  const int64_t n = static_cast<int64_t>(rows) * cols;
  if (n <= 0) return cudaSuccess;
  one_hot_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, cols, labels, onehot, error);
  return cudaGetLastError();
}

// out[r] = index of the first maximum of row r (std::max_element's choice).
cudaError_t argmax_rows(cudaStream_t stream, int rows, int cols, const float* x, int32_t* out) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  argmax_rows_kernel<<<RowBlocks(rows), kThreads, 0, stream>>>(rows, cols, x, out);
  return cudaGetLastError();
}

cudaError_t count_correct(cudaStream_t stream, int rows, int cols, const float* x,
                          const int32_t* labels, int32_t* correct) {
  cudaError_t rc = cudaMemsetAsync(correct, 0, sizeof(int32_t), stream);
  if (rc != cudaSuccess || rows <= 0 || cols <= 0) return rc;
  count_correct_kernel<<<RowBlocks(rows), kThreads, 0, stream>>>(rows, cols, x, labels, correct);
  return cudaGetLastError();
}

}  // namespace

}  // namespace kiln::cuda_kernels

namespace kiln {

namespace ck = cuda_kernels;

absl::Status CudaBackend::SoftmaxCrossEntropy(int rows, int cols, const float* logits,
                                              const int32_t* labels, float label_smoothing,
                                              float* loss, int32_t* correct, float* dlogits) {
  KILN_RETURN_IF_ERROR(CheckSoftmaxCrossEntropy(rows, cols, label_smoothing));
  KILN_RETURN_IF_ERROR(Activate());
  if (rows == 0) {
    // As on the CPU: the mean over no rows is NaN, and no row is correct.
    KILN_CUDA_CHECK(ck::fill_u32(stream_, 1, 0x7fc00000u, loss));
    KILN_CUDA_CHECK(cudaMemsetAsync(correct, 0, sizeof(int32_t), stream_));
    return absl::OkStatus();
  }
  KILN_ASSIGN_OR_RETURN(void* scratch,
                        GetScratch(Scratch::kTemp, static_cast<size_t>(std::max(rows, 1)) * 8));
  kernel_error_pending_ = true;
  KILN_CUDA_CHECK(ck::softmax_xent(stream_, rows, cols, logits, labels, label_smoothing, loss,
                                   correct, dlogits, scratch,
                                   static_cast<ck::KernelErrorRecord*>(kernel_error_)));
  return absl::OkStatus();
}

absl::Status CudaBackend::MeanSquaredError(int64_t n, const float* y, const float* target,
                                           float* loss, float* dy) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_ASSIGN_OR_RETURN(
      void* scratch, GetScratch(Scratch::kTemp, static_cast<size_t>(std::max<int64_t>(
                                                    ck::mean_squared_error_scratch_bytes(n), 8))));
  KILN_CUDA_CHECK(ck::mean_squared_error(stream_, n, y, target, loss, dy, scratch));
  return absl::OkStatus();
}

absl::Status CudaBackend::OneHot(int rows, int cols, const int32_t* labels, float* onehot) {
  KILN_RETURN_IF_ERROR(Activate());
  kernel_error_pending_ = true;
  KILN_CUDA_CHECK(ck::one_hot(stream_, rows, cols, labels, onehot,
                              static_cast<ck::KernelErrorRecord*>(kernel_error_)));
  return absl::OkStatus();
}

absl::Status CudaBackend::Argmax(int rows, int cols, const float* x, int32_t* out) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::argmax_rows(stream_, rows, cols, x, out));
  return absl::OkStatus();
}

absl::Status CudaBackend::CountCorrect(int rows, int cols, const float* x, const int32_t* labels,
                                       int32_t* correct) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::count_correct(stream_, rows, cols, x, labels, correct));
  return absl::OkStatus();
}

}  // namespace kiln
