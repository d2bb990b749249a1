// CudaBackend's element-wise and row-wise ops with their kernels: fill, ReLU and the other
// activations, dropout, add, scale, bias, softmax, and Copy2D. Each kernel matches the CPU
// backend's formula exactly (engine/cpu/elementwise_ops.cc).
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "engine/activation_math.h"
#include "engine/backend_checks.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cuda_kernels.h"
#include "engine/cuda/device_math.cuh"

namespace kiln::cuda_kernels {

namespace {

__global__ void fill_u32_kernel(int64_t n, uint32_t bits, uint32_t* dst) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) dst[i] = bits;
}

__global__ void relu_forward_kernel(int64_t n, const float* x, float* y) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float v = x[i];
    y[i] = v > 0.0f ? v : 0.0f;  // NaN becomes 0, as on the CPU
  }
}

__global__ void relu_backward_kernel(int64_t n, const float* y, const float* dy, float* dx) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float d = dy[i];
    dx[i] = y[i] > 0.0f ? d : 0.0f;
  }
}

// The activations, one kernel instantiation per kind; activation_math.h's formulas.
namespace am = activation_math;

template <ActivationKind kKind>
__global__ void activation_forward_kernel(int64_t n, float param, const float* x, float* y) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float v = x[i];
    if (kKind == ActivationKind::kTanh) y[i] = am::TanhForward(v);
    if (kKind == ActivationKind::kSigmoid) y[i] = am::SigmoidForward(v);
    if (kKind == ActivationKind::kGelu) y[i] = am::GeluForward(v);
    if (kKind == ActivationKind::kLeakyRelu) y[i] = am::LeakyReluForward(v, param);
    if (kKind == ActivationKind::kSilu) y[i] = am::SiluForward(v);
  }
}

template <ActivationKind kKind>
__global__ void activation_backward_kernel(int64_t n, float param, const float* x, const float* y,
                                           const float* dy, float* dx) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float d = dy[i];
    if (kKind == ActivationKind::kTanh) dx[i] = am::TanhBackward(y[i], d);
    if (kKind == ActivationKind::kSigmoid) dx[i] = am::SigmoidBackward(y[i], d);
    if (kKind == ActivationKind::kGelu) dx[i] = am::GeluBackward(x[i], d);
    if (kKind == ActivationKind::kLeakyRelu) dx[i] = am::LeakyReluBackward(x[i], param, d);
    if (kKind == ActivationKind::kSilu) dx[i] = am::SiluBackward(x[i], d);
  }
}

__global__ void dropout_forward_kernel(int64_t n, float p, float keep_scale, uint64_t seed,
                                       uint64_t offset, const float* x, float* mask, float* y) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float m =
        CounterUniform(seed, offset + static_cast<uint64_t>(i)) >= p ? keep_scale : 0.0f;
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

__global__ void add_kernel(int64_t n, const float* a, const float* b, float* y) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) y[i] = a[i] + b[i];
}

__global__ void scale_kernel(int64_t n, float alpha, float* x) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) x[i] *= alpha;
}

__global__ void multiply_kernel(int64_t n, const float* a, const float* b, float* out) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) out[i] = a[i] * b[i];
}

__global__ void bias_forward_kernel(int64_t n, int cols, const float* bias, float* y) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) y[i] += bias[i % cols];
}

// Block (32 columns) x (8 row groups): row group g sums rows g, g+8, ... of its column, then the
// eight partials are added in order.
constexpr int kBiasRowGroups = kThreads / kWarp;
__global__ void bias_backward_kernel(int rows, int cols, const float* dy, float* dbias) {
  __shared__ float partial[kBiasRowGroups][kWarp];
  const int col = blockIdx.x * kWarp + threadIdx.x, group = threadIdx.y;
  float sum = 0.0f;
  if (col < cols) {
    for (int r = group; r < rows; r += kBiasRowGroups)
      sum += dy[static_cast<int64_t>(r) * cols + col];
  }
  partial[group][threadIdx.x] = sum;
  __syncthreads();
  if (group == 0 && col < cols) {
    float total = 0.0f;
    for (int g = 0; g < kBiasRowGroups; ++g) total += partial[g][threadIdx.x];
    dbias[col] += total;
  }
}

// One warp per row; kThreads / kWarp rows per block.
__global__ void softmax_forward_kernel(int rows, int cols, const float* x, float* y) {
  const int row = blockIdx.x * (kThreads / kWarp) + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const float* xr = x + static_cast<int64_t>(row) * cols;
  float* yr = y + static_cast<int64_t>(row) * cols;
  const float mx = xr[WarpRowArgmax(xr, cols, lane)];
  float sum = 0.0f;
  for (int c = lane; c < cols; c += kWarp) sum += expf(xr[c] - mx);
  sum = WarpSum(sum);
  const float inv = 1.0f / sum;
  for (int c = lane; c < cols; c += kWarp) yr[c] = expf(xr[c] - mx) * inv;
}

cudaError_t relu_forward(cudaStream_t stream, int64_t n, const float* x, float* y) {
  if (n <= 0) return cudaSuccess;
  relu_forward_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, x, y);
  return cudaGetLastError();
}

// y = f(x) for the activation `kind`; `param` is leaky ReLU's slope.
cudaError_t activation_forward(cudaStream_t stream, ActivationKind kind, float param, int64_t n,
                               const float* x, float* y) {
  if (n <= 0) return cudaSuccess;
  const unsigned grid = GridFor(n);
  switch (kind) {
    case ActivationKind::kTanh:
      activation_forward_kernel<ActivationKind::kTanh>
          <<<grid, kThreads, 0, stream>>>(n, param, x, y);
      break;
    case ActivationKind::kSigmoid:
      activation_forward_kernel<ActivationKind::kSigmoid>
          <<<grid, kThreads, 0, stream>>>(n, param, x, y);
      break;
    case ActivationKind::kGelu:
      activation_forward_kernel<ActivationKind::kGelu>
          <<<grid, kThreads, 0, stream>>>(n, param, x, y);
      break;
    case ActivationKind::kLeakyRelu:
      activation_forward_kernel<ActivationKind::kLeakyRelu>
          <<<grid, kThreads, 0, stream>>>(n, param, x, y);
      break;
    case ActivationKind::kSilu:
      activation_forward_kernel<ActivationKind::kSilu>
          <<<grid, kThreads, 0, stream>>>(n, param, x, y);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

// dx = dy * f'(x), from x or y as each kind needs.
cudaError_t activation_backward(cudaStream_t stream, ActivationKind kind, float param, int64_t n,
                                const float* x, const float* y, const float* dy, float* dx) {
  if (n <= 0) return cudaSuccess;
  const unsigned grid = GridFor(n);
  switch (kind) {
    case ActivationKind::kTanh:
      activation_backward_kernel<ActivationKind::kTanh>
          <<<grid, kThreads, 0, stream>>>(n, param, x, y, dy, dx);
      break;
    case ActivationKind::kSigmoid:
      activation_backward_kernel<ActivationKind::kSigmoid>
          <<<grid, kThreads, 0, stream>>>(n, param, x, y, dy, dx);
      break;
    case ActivationKind::kGelu:
      activation_backward_kernel<ActivationKind::kGelu>
          <<<grid, kThreads, 0, stream>>>(n, param, x, y, dy, dx);
      break;
    case ActivationKind::kLeakyRelu:
      activation_backward_kernel<ActivationKind::kLeakyRelu>
          <<<grid, kThreads, 0, stream>>>(n, param, x, y, dy, dx);
      break;
    case ActivationKind::kSilu:
      activation_backward_kernel<ActivationKind::kSilu>
          <<<grid, kThreads, 0, stream>>>(n, param, x, y, dy, dx);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

// mask[i] = CounterUniform(seed, offset + i) >= p ? keep_scale : 0 (engine/rng.h, bit for bit);
// y = x * mask.
cudaError_t dropout_forward(cudaStream_t stream, int64_t n, float p, float keep_scale,
                            uint64_t seed, uint64_t offset, const float* x, float* mask, float* y) {
  if (n <= 0) return cudaSuccess;
  dropout_forward_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, p, keep_scale, seed, offset, x,
                                                              mask, y);
  return cudaGetLastError();
}

// y = a + b element-wise; y may be a or b.
cudaError_t add(cudaStream_t stream, int64_t n, const float* a, const float* b, float* y) {
  if (n <= 0) return cudaSuccess;
  add_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, a, b, y);
  return cudaGetLastError();
}

// x(n) *= alpha.
cudaError_t scale(cudaStream_t stream, int64_t n, float alpha, float* x) {
  if (n <= 0) return cudaSuccess;
  scale_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, alpha, x);
  return cudaGetLastError();
}

// out = a * b element-wise (dropout's backward).
cudaError_t multiply(cudaStream_t stream, int64_t n, const float* a, const float* b, float* out) {
  if (n <= 0) return cudaSuccess;
  multiply_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, a, b, out);
  return cudaGetLastError();
}

// y(rows, cols) += bias(cols).
cudaError_t bias_forward(cudaStream_t stream, int rows, int cols, const float* bias, float* y) {
  const int64_t n = static_cast<int64_t>(rows) * cols;
  if (n <= 0) return cudaSuccess;
  bias_forward_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, cols, bias, y);
  return cudaGetLastError();
}

// dbias(cols) += column sums of dy(rows, cols), in a fixed order.
cudaError_t bias_backward(cudaStream_t stream, int rows, int cols, const float* dy, float* dbias) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const dim3 block(kWarp, kBiasRowGroups);
  bias_backward_kernel<<<(cols + kWarp - 1) / kWarp, block, 0, stream>>>(rows, cols, dy, dbias);
  return cudaGetLastError();
}

// y(rows, cols) = softmax of each row of x.
cudaError_t softmax_forward(cudaStream_t stream, int rows, int cols, const float* x, float* y) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  constexpr int kRowsPerBlock = kThreads / kWarp;
  softmax_forward_kernel<<<(rows + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, stream>>>(
      rows, cols, x, y);
  return cudaGetLastError();
}

}  // namespace

// dst[0:n] = the 32-bit pattern `bits` (a float or an int32).
cudaError_t fill_u32(cudaStream_t stream, int64_t n, uint32_t bits, void* dst) {
  if (n <= 0) return cudaSuccess;
  fill_u32_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, bits, static_cast<uint32_t*>(dst));
  return cudaGetLastError();
}

cudaError_t relu_backward(cudaStream_t stream, int64_t n, const float* y, const float* dy,
                          float* dx) {
  if (n <= 0) return cudaSuccess;
  relu_backward_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, y, dy, dx);
  return cudaGetLastError();
}

}  // namespace kiln::cuda_kernels

namespace kiln {

namespace ck = cuda_kernels;

absl::Status CudaBackend::BiasForward(int rows, int cols, const float* bias, float* y) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::bias_forward(stream_, rows, cols, bias, y));
  return absl::OkStatus();
}

absl::Status CudaBackend::BiasBackward(int rows, int cols, const float* dy, float* dbias) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::bias_backward(stream_, rows, cols, dy, dbias));
  return absl::OkStatus();
}

absl::Status CudaBackend::ReluForward(int64_t n, const float* x, float* y) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::relu_forward(stream_, n, x, y));
  return absl::OkStatus();
}

absl::Status CudaBackend::ReluBackward(int64_t n, const float* y, const float* dy, float* dx) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::relu_backward(stream_, n, y, dy, dx));
  return absl::OkStatus();
}

absl::Status CudaBackend::DropoutForward(int64_t n, float p, uint64_t seed, uint64_t offset,
                                         const float* x, float* mask, float* y) {
  KILN_RETURN_IF_ERROR(Activate());
  const float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  KILN_CUDA_CHECK(ck::dropout_forward(stream_, n, p, keep_scale, seed, offset, x, mask, y));
  return absl::OkStatus();
}

absl::Status CudaBackend::DropoutBackward(int64_t n, const float* mask, const float* dy,
                                          float* dx) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::multiply(stream_, n, dy, mask, dx));
  return absl::OkStatus();
}

absl::Status CudaBackend::SoftmaxForward(int rows, int cols, const float* x, float* y) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::softmax_forward(stream_, rows, cols, x, y));
  return absl::OkStatus();
}

absl::Status CudaBackend::ActivationForward(ActivationKind kind, float param, int64_t n,
                                            const float* x, float* y) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::activation_forward(stream_, kind, param, n, x, y));
  return absl::OkStatus();
}

absl::Status CudaBackend::ActivationBackward(ActivationKind kind, float param, int64_t n,
                                             const float* x, const float* y, const float* dy,
                                             float* dx) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::activation_backward(stream_, kind, param, n, x, y, dy, dx));
  return absl::OkStatus();
}

absl::Status CudaBackend::Add(int64_t n, const float* a, const float* b, float* y) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::add(stream_, n, a, b, y));
  return absl::OkStatus();
}

absl::Status CudaBackend::Scale(int64_t n, float alpha, float* x) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::scale(stream_, n, alpha, x));
  return absl::OkStatus();
}

absl::Status CudaBackend::Copy2D(int64_t rows, int64_t cols, const float* src, int64_t src_stride,
                                 float* dst, int64_t dst_stride) {
  KILN_RETURN_IF_ERROR(CheckCopy2D(rows, cols, src_stride, dst_stride));
  if (rows == 0 || cols == 0) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(Activate());
  constexpr size_t kF = sizeof(float);
  KILN_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_stride) * kF, src,
                                    static_cast<size_t>(src_stride) * kF,
                                    static_cast<size_t>(cols) * kF, static_cast<size_t>(rows),
                                    cudaMemcpyDeviceToDevice, stream_));
  return absl::OkStatus();
}

}  // namespace kiln
