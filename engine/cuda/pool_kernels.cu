// Max pooling with recorded winners: forward keeps each window's argmax (flat index within the
// input plane, the CPU backend's order and NaN rule); backward gathers, for each input pixel, the
// gradients of the windows it won, in output order, so it needs no atomics and sums as the CPU.
#include "engine/cuda/cuda_kernels.h"
#include "engine/cuda/device_math.cuh"

namespace kiln::cuda_kernels {

namespace {

// One thread per output element; x and y are (planes, in_h, in_w) and (planes, out_h, out_w).
__global__ void maxpool_forward_kernel(PoolShape s, const float* x, float* y, int32_t* argmax) {
  const int64_t out_plane = static_cast<int64_t>(s.out_h) * s.out_w;
  const int64_t n = out_plane * s.planes;
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const int64_t p = i / out_plane;
    const int o = static_cast<int>(i - p * out_plane);
    const int oi = o / s.out_w, oj = o % s.out_w;
    const float* in = x + p * s.in_h * s.in_w;
    const int top = oi * s.stride * s.in_w + oj * s.stride;
    int best = top;
    float best_v = in[top];
    for (int a = 0; a < s.kernel; ++a) {
      for (int b = 0; b < s.kernel; ++b) {
        const int q = top + a * s.in_w + b;
        const float v = in[q];
        // `!(v <= best_v)` also takes a NaN, exactly as the CPU backend does.
        if (!(v <= best_v)) {
          best_v = v;
          best = q;
        }
      }
    }
    y[i] = best_v;
    argmax[i] = best;
  }
}

// One thread per input pixel: the windows (oi, oj) holding row ih satisfy
// oi * stride <= ih < oi * stride + kernel; likewise for columns.
__global__ void maxpool_backward_kernel(PoolShape s, const float* dy, const int32_t* argmax,
                                        float* dx) {
  const int64_t in_plane = static_cast<int64_t>(s.in_h) * s.in_w;
  const int64_t out_plane = static_cast<int64_t>(s.out_h) * s.out_w;
  const int64_t n = in_plane * s.planes;
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const int64_t p = i / in_plane;
    const int pixel = static_cast<int>(i - p * in_plane);
    const int ih = pixel / s.in_w, iw = pixel % s.in_w;
    const int oi_lo = ih >= s.kernel ? (ih - s.kernel) / s.stride + 1 : 0;
    const int oj_lo = iw >= s.kernel ? (iw - s.kernel) / s.stride + 1 : 0;
    const int oi_hi = min(ih / s.stride, s.out_h - 1), oj_hi = min(iw / s.stride, s.out_w - 1);
    const float* g = dy + p * out_plane;
    const int32_t* am = argmax + p * out_plane;
    float sum = 0.0f;
    for (int oi = oi_lo; oi <= oi_hi; ++oi) {
      for (int oj = oj_lo; oj <= oj_hi; ++oj) {
        const int o = oi * s.out_w + oj;
        if (am[o] == pixel) sum += g[o];
      }
    }
    dx[i] = sum;
  }
}

}  // namespace

cudaError_t maxpool_forward(cudaStream_t stream, const PoolShape& s, const float* x, float* y,
                            int32_t* argmax) {
  const int64_t n = static_cast<int64_t>(s.planes) * s.out_h * s.out_w;
  if (n <= 0 || s.out_h <= 0 || s.out_w <= 0) return cudaSuccess;
  maxpool_forward_kernel<<<GridFor(n), kThreads, 0, stream>>>(s, x, y, argmax);
  return cudaGetLastError();
}

cudaError_t maxpool_backward(cudaStream_t stream, const PoolShape& s, const float* dy,
                             const int32_t* argmax, float* dx) {
  const int64_t n = static_cast<int64_t>(s.planes) * s.in_h * s.in_w;
  if (n <= 0) return cudaSuccess;
  maxpool_backward_kernel<<<GridFor(n), kThreads, 0, stream>>>(s, dy, argmax, dx);
  return cudaGetLastError();
}

}  // namespace kiln::cuda_kernels
