// Element-wise and row-wise kernels: fill, ReLU and the other activations, dropout, add, bias,
// softmax, and the bias and ReLU
// that ride along with cuDNN's convolutions. Each matches the CPU backend's formula exactly.
#include "engine/activation_math.h"
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

// The activations, one kernel instantiation per kind (ActivationCode, cuda_kernels.h).
namespace am = activation_math;

template <int kKind>
__global__ void activation_forward_kernel(int64_t n, float param, const float* x, float* y) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float v = x[i];
    if (kKind == kTanh) y[i] = am::TanhForward(v);
    if (kKind == kSigmoid) y[i] = am::SigmoidForward(v);
    if (kKind == kGelu) y[i] = am::GeluForward(v);
    if (kKind == kLeakyRelu) y[i] = am::LeakyReluForward(v, param);
    if (kKind == kSilu) y[i] = am::SiluForward(v);
  }
}

template <int kKind>
__global__ void activation_backward_kernel(int64_t n, float param, const float* x, const float* y,
                                           const float* dy, float* dx) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float d = dy[i];
    if (kKind == kTanh) dx[i] = am::TanhBackward(y[i], d);
    if (kKind == kSigmoid) dx[i] = am::SigmoidBackward(y[i], d);
    if (kKind == kGelu) dx[i] = am::GeluBackward(x[i], d);
    if (kKind == kLeakyRelu) dx[i] = am::LeakyReluBackward(x[i], param, d);
    if (kKind == kSilu) dx[i] = am::SiluBackward(x[i], d);
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

__global__ void conv_bias_act_forward_kernel(int64_t n, int channels, int64_t plane,
                                             const float* bias, bool relu, float* y) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float b = bias != nullptr ? bias[(i / plane) % channels] : 0.0f;
    const float v = y[i] + b;
    y[i] = relu && v < 0.0f ? 0.0f : v;
  }
}

// One block per channel: walks the channel's planes sample by sample.
__global__ void conv_bias_act_backward_kernel(int batch, int channels, int64_t plane,
                                              const float* relu_y, const float* dy, float* masked,
                                              float* dbias) {
  const int c = blockIdx.x;
  float sum = 0.0f;
  for (int n = 0; n < batch; ++n) {
    const int64_t base = (static_cast<int64_t>(n) * channels + c) * plane;
    for (int64_t j = threadIdx.x; j < plane; j += kThreads) {
      float d = dy[base + j];
      if (relu_y != nullptr) d = relu_y[base + j] > 0.0f ? d : 0.0f;
      if (masked != nullptr) masked[base + j] = d;
      sum += d;
    }
  }
  if (dbias == nullptr) return;  // uniform across the block: no thread waits in BlockSum
  sum = BlockSum(sum);
  if (threadIdx.x == 0) dbias[c] += sum;
}

}  // namespace

cudaError_t fill_u32(cudaStream_t stream, int64_t n, uint32_t bits, void* dst) {
  if (n <= 0) return cudaSuccess;
  fill_u32_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, bits, static_cast<uint32_t*>(dst));
  return cudaGetLastError();
}

cudaError_t relu_forward(cudaStream_t stream, int64_t n, const float* x, float* y) {
  if (n <= 0) return cudaSuccess;
  relu_forward_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, x, y);
  return cudaGetLastError();
}

cudaError_t relu_backward(cudaStream_t stream, int64_t n, const float* y, const float* dy,
                          float* dx) {
  if (n <= 0) return cudaSuccess;
  relu_backward_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, y, dy, dx);
  return cudaGetLastError();
}

cudaError_t activation_forward(cudaStream_t stream, int kind, float param, int64_t n,
                               const float* x, float* y) {
  if (n <= 0) return cudaSuccess;
  const unsigned grid = GridFor(n);
  switch (kind) {
    case kTanh:
      activation_forward_kernel<kTanh><<<grid, kThreads, 0, stream>>>(n, param, x, y);
      break;
    case kSigmoid:
      activation_forward_kernel<kSigmoid><<<grid, kThreads, 0, stream>>>(n, param, x, y);
      break;
    case kGelu:
      activation_forward_kernel<kGelu><<<grid, kThreads, 0, stream>>>(n, param, x, y);
      break;
    case kLeakyRelu:
      activation_forward_kernel<kLeakyRelu><<<grid, kThreads, 0, stream>>>(n, param, x, y);
      break;
    case kSilu:
      activation_forward_kernel<kSilu><<<grid, kThreads, 0, stream>>>(n, param, x, y);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t activation_backward(cudaStream_t stream, int kind, float param, int64_t n,
                                const float* x, const float* y, const float* dy, float* dx) {
  if (n <= 0) return cudaSuccess;
  const unsigned grid = GridFor(n);
  switch (kind) {
    case kTanh:
      activation_backward_kernel<kTanh><<<grid, kThreads, 0, stream>>>(n, param, x, y, dy, dx);
      break;
    case kSigmoid:
      activation_backward_kernel<kSigmoid><<<grid, kThreads, 0, stream>>>(n, param, x, y, dy, dx);
      break;
    case kGelu:
      activation_backward_kernel<kGelu><<<grid, kThreads, 0, stream>>>(n, param, x, y, dy, dx);
      break;
    case kLeakyRelu:
      activation_backward_kernel<kLeakyRelu><<<grid, kThreads, 0, stream>>>(n, param, x, y, dy, dx);
      break;
    case kSilu:
      activation_backward_kernel<kSilu><<<grid, kThreads, 0, stream>>>(n, param, x, y, dy, dx);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t dropout_forward(cudaStream_t stream, int64_t n, float p, float keep_scale,
                            uint64_t seed, uint64_t offset, const float* x, float* mask, float* y) {
  if (n <= 0) return cudaSuccess;
  dropout_forward_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, p, keep_scale, seed, offset, x,
                                                              mask, y);
  return cudaGetLastError();
}

cudaError_t add(cudaStream_t stream, int64_t n, const float* a, const float* b, float* y) {
  if (n <= 0) return cudaSuccess;
  add_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, a, b, y);
  return cudaGetLastError();
}

cudaError_t scale(cudaStream_t stream, int64_t n, float alpha, float* x) {
  if (n <= 0) return cudaSuccess;
  scale_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, alpha, x);
  return cudaGetLastError();
}

cudaError_t multiply(cudaStream_t stream, int64_t n, const float* a, const float* b, float* out) {
  if (n <= 0) return cudaSuccess;
  multiply_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, a, b, out);
  return cudaGetLastError();
}

cudaError_t bias_forward(cudaStream_t stream, int rows, int cols, const float* bias, float* y) {
  const int64_t n = static_cast<int64_t>(rows) * cols;
  if (n <= 0) return cudaSuccess;
  bias_forward_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, cols, bias, y);
  return cudaGetLastError();
}

cudaError_t bias_backward(cudaStream_t stream, int rows, int cols, const float* dy, float* dbias) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const dim3 block(kWarp, kBiasRowGroups);
  bias_backward_kernel<<<(cols + kWarp - 1) / kWarp, block, 0, stream>>>(rows, cols, dy, dbias);
  return cudaGetLastError();
}

cudaError_t softmax_forward(cudaStream_t stream, int rows, int cols, const float* x, float* y) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  constexpr int kRowsPerBlock = kThreads / kWarp;
  softmax_forward_kernel<<<(rows + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, stream>>>(
      rows, cols, x, y);
  return cudaGetLastError();
}

cudaError_t conv_bias_act_forward(cudaStream_t stream, int batch, int channels, int64_t plane,
                                  const float* bias, ConvActivation act, float* y) {
  const int64_t n = static_cast<int64_t>(batch) * channels * plane;
  if (n <= 0 || (bias == nullptr && act == ConvActivation::kNone)) return cudaSuccess;
  conv_bias_act_forward_kernel<<<GridFor(n), kThreads, 0, stream>>>(
      n, channels, plane, bias, act == ConvActivation::kRelu, y);
  return cudaGetLastError();
}

cudaError_t conv_bias_act_backward(cudaStream_t stream, int batch, int channels, int64_t plane,
                                   const float* relu_y, const float* dy, float* masked,
                                   float* dbias) {
  if (batch <= 0 || channels <= 0 || plane <= 0) return cudaSuccess;
  conv_bias_act_backward_kernel<<<channels, kThreads, 0, stream>>>(batch, channels, plane, relu_y,
                                                                   dy, masked, dbias);
  return cudaGetLastError();
}

}  // namespace kiln::cuda_kernels
