// CudaBackend's pooling with its kernels. Max pooling records winners: forward keeps each window's
// argmax (flat index within the input plane, the CPU backend's order and NaN rule); backward
// gathers, for each input pixel, the gradients of the windows it won, in output order, so it needs
// no atomics and sums as the CPU. Average pooling counts padding as zeros (PyTorch's
// count_include_pad=True) and its backward gathers likewise. Windows are clipped to the input:
// padding is never read.
#include <cstdint>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "engine/backend_checks.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/device_math.cuh"
#include "engine/pool_window.h"

namespace kiln::cuda_kernels {

namespace {

// A Pool2dGeometry as the kernels take it, by value.
struct PoolShape {
  int planes, in_h, in_w;  // planes = batch * channels
  int kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w;
  int out_h, out_w;
};

// Output element i of (planes, out_h, out_w): its plane and its window, clipped to the input.
struct OutputWindow {
  int64_t plane;
  PoolSpan rows, cols;
};
__device__ __forceinline__ OutputWindow WindowOf(const PoolShape& s, int64_t i) {
  const int64_t out_plane = static_cast<int64_t>(s.out_h) * s.out_w;
  const int64_t p = i / out_plane;
  const int o = static_cast<int>(i - p * out_plane);
  return {p, PoolWindow(o / s.out_w, s.stride_h, s.pad_h, s.kernel_h, s.in_h),
          PoolWindow(o % s.out_w, s.stride_w, s.pad_w, s.kernel_w, s.in_w)};
}

// The output rows [lo, hi) whose windows hold input row i along one axis: those with
// o * stride - pad <= i < o * stride - pad + kernel.
__device__ __forceinline__ PoolSpan OutputRange(int i, int stride, int pad, int kernel, int out) {
  const int shifted = i + pad;  // >= 0
  return {shifted >= kernel ? (shifted - kernel) / stride + 1 : 0,
          min(shifted / stride, out - 1) + 1};
}

// Input pixel i of (planes, in_h, in_w): its plane, its place in the plane, and the output rows and
// columns whose windows hold it.
struct InputWindows {
  int64_t plane;
  int pixel;
  PoolSpan rows, cols;
};
__device__ __forceinline__ InputWindows WindowsHolding(const PoolShape& s, int64_t i) {
  const int64_t in_plane = static_cast<int64_t>(s.in_h) * s.in_w;
  const int64_t p = i / in_plane;
  const int pixel = static_cast<int>(i - p * in_plane);
  return {p, pixel, OutputRange(pixel / s.in_w, s.stride_h, s.pad_h, s.kernel_h, s.out_h),
          OutputRange(pixel % s.in_w, s.stride_w, s.pad_w, s.kernel_w, s.out_w)};
}

// One thread per output element; x and y are (planes, in_h, in_w) and (planes, out_h, out_w).
__global__ void maxpool_forward_kernel(PoolShape s, const float* x, float* y, int32_t* argmax) {
  const int64_t out_plane = static_cast<int64_t>(s.out_h) * s.out_w;
  const int64_t n = out_plane * s.planes;
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const OutputWindow w = WindowOf(s, i);
    const float* in = x + w.plane * s.in_h * s.in_w;
    int best = w.rows.lo * s.in_w + w.cols.lo;
    float best_v = in[best];
    for (int a = w.rows.lo; a < w.rows.hi; ++a) {
      for (int b = w.cols.lo; b < w.cols.hi; ++b) {
        const int q = a * s.in_w + b;
        const float v = in[q];
        if (MaxPoolTakes(v, best_v)) {
          best_v = v;
          best = q;
        }
      }
    }
    y[i] = best_v;
    argmax[i] = best;
  }
}

// One thread per input pixel, over the windows that can hold it.
__global__ void maxpool_backward_kernel(PoolShape s, const float* dy, const int32_t* argmax,
                                        float* dx) {
  const int64_t in_plane = static_cast<int64_t>(s.in_h) * s.in_w;
  const int64_t out_plane = static_cast<int64_t>(s.out_h) * s.out_w;
  const int64_t n = in_plane * s.planes;
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const InputWindows w = WindowsHolding(s, i);
    const float* g = dy + w.plane * out_plane;
    const int32_t* am = argmax + w.plane * out_plane;
    float sum = 0.0f;
    for (int oi = w.rows.lo; oi < w.rows.hi; ++oi) {
      for (int oj = w.cols.lo; oj < w.cols.hi; ++oj) {
        const int o = oi * s.out_w + oj;
        if (am[o] == w.pixel) sum += g[o];
      }
    }
    dx[i] = sum;
  }
}

__global__ void avgpool_forward_kernel(PoolShape s, const float* x, float* y) {
  const int64_t out_plane = static_cast<int64_t>(s.out_h) * s.out_w;
  const int64_t n = out_plane * s.planes;
  const float divisor = static_cast<float>(s.kernel_h * s.kernel_w);
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const OutputWindow w = WindowOf(s, i);
    const float* in = x + w.plane * s.in_h * s.in_w;
    float sum = 0.0f;
    for (int a = w.rows.lo; a < w.rows.hi; ++a) {
      for (int b = w.cols.lo; b < w.cols.hi; ++b) sum += in[a * s.in_w + b];
    }
    y[i] = sum / divisor;
  }
}

__global__ void avgpool_backward_kernel(PoolShape s, const float* dy, float* dx) {
  const int64_t in_plane = static_cast<int64_t>(s.in_h) * s.in_w;
  const int64_t out_plane = static_cast<int64_t>(s.out_h) * s.out_w;
  const int64_t n = in_plane * s.planes;
  const float divisor = static_cast<float>(s.kernel_h * s.kernel_w);
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const InputWindows w = WindowsHolding(s, i);
    const float* g = dy + w.plane * out_plane;
    float sum = 0.0f;
    for (int oi = w.rows.lo; oi < w.rows.hi; ++oi) {
      for (int oj = w.cols.lo; oj < w.cols.hi; ++oj) sum += g[oi * s.out_w + oj] / divisor;
    }
    dx[i] = sum;
  }
}

// y = window maxima, argmax = the winner's flat index within its input plane (the CPU backend's
// order and NaN rule; padded positions never win).
cudaError_t maxpool_forward(cudaStream_t stream, const PoolShape& s, const float* x, float* y,
                            int32_t* argmax) {
  const int64_t n = static_cast<int64_t>(s.planes) * s.out_h * s.out_w;
  if (n <= 0 || s.out_h <= 0 || s.out_w <= 0) return cudaSuccess;
  maxpool_forward_kernel<<<GridFor(n), kThreads, 0, stream>>>(s, x, y, argmax);
  return cudaGetLastError();
}

// dx = sum of dy over the windows whose argmax is that pixel (overwrites dx, fixed order).
cudaError_t maxpool_backward(cudaStream_t stream, const PoolShape& s, const float* dy,
                             const int32_t* argmax, float* dx) {
  const int64_t n = static_cast<int64_t>(s.planes) * s.in_h * s.in_w;
  if (n <= 0) return cudaSuccess;
  maxpool_backward_kernel<<<GridFor(n), kThreads, 0, stream>>>(s, dy, argmax, dx);
  return cudaGetLastError();
}

// y = window sums / (kernel_h * kernel_w), padding counted as zeros (the CPU backend's order).
cudaError_t avgpool_forward(cudaStream_t stream, const PoolShape& s, const float* x, float* y) {
  const int64_t n = static_cast<int64_t>(s.planes) * s.out_h * s.out_w;
  if (n <= 0 || s.out_h <= 0 || s.out_w <= 0) return cudaSuccess;
  avgpool_forward_kernel<<<GridFor(n), kThreads, 0, stream>>>(s, x, y);
  return cudaGetLastError();
}

// dx = sum of dy / (kernel_h * kernel_w) over the windows holding each pixel, in output order.
cudaError_t avgpool_backward(cudaStream_t stream, const PoolShape& s, const float* dy, float* dx) {
  const int64_t n = static_cast<int64_t>(s.planes) * s.in_h * s.in_w;
  if (n <= 0) return cudaSuccess;
  avgpool_backward_kernel<<<GridFor(n), kThreads, 0, stream>>>(s, dy, dx);
  return cudaGetLastError();
}

}  // namespace

}  // namespace kiln::cuda_kernels

namespace kiln {

namespace {
namespace ck = cuda_kernels;

ck::PoolShape ToPoolShape(const Pool2dGeometry& g) {
  return {g.batch * g.channels, g.in_h,      g.in_w,      g.kernel_h, g.kernel_w, g.stride_h,
          g.stride_w,           g.padding_h, g.padding_w, g.out_h(),  g.out_w()};
}

}  // namespace

absl::Status CudaBackend::MaxPool2dForward(const Pool2dGeometry& g, const float* x, float* y,
                                           int32_t* argmax) {
  KILN_RETURN_IF_ERROR(CheckMaxPool2d(g));
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::maxpool_forward(stream_, ToPoolShape(g), x, y, argmax));
  return absl::OkStatus();
}

absl::Status CudaBackend::MaxPool2dBackward(const Pool2dGeometry& g, const float* dy,
                                            const int32_t* argmax, float* dx) {
  KILN_RETURN_IF_ERROR(CheckMaxPool2d(g));
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::maxpool_backward(stream_, ToPoolShape(g), dy, argmax, dx));
  return absl::OkStatus();
}

absl::Status CudaBackend::AvgPool2dForward(const Pool2dGeometry& g, const float* x, float* y) {
  KILN_RETURN_IF_ERROR(CheckAvgPool2d(g, *this));
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::avgpool_forward(stream_, ToPoolShape(g), x, y));
  return absl::OkStatus();
}

absl::Status CudaBackend::AvgPool2dBackward(const Pool2dGeometry& g, const float* dy, float* dx) {
  KILN_RETURN_IF_ERROR(CheckAvgPool2d(g, *this));
  KILN_RETURN_IF_ERROR(Activate());
  KILN_CUDA_CHECK(ck::avgpool_backward(stream_, ToPoolShape(g), dy, dx));
  return absl::OkStatus();
}

}  // namespace kiln
