// CpuBackend's pooling: max pooling with PyTorch's scan order and NaN rule, average pooling with
// its count_include_pad=True divisor; both with implicit padding.
#include <omp.h>

#include <cstring>

#include "engine/backend_checks.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/cpu_parallel.h"
#include "engine/cpu/nchw16c.h"
#include "engine/pool_window.h"

namespace kiln {

using cpu_internal::kParallelMin;

absl::Status CpuBackend::MaxPool2dForward(const Pool2dGeometry& g, const float* x, float* y,
                                          int32_t* argmax) {
  if (absl::Status s = CheckMaxPool2d(g); !s.ok()) return s;
  // The geometry in locals: stores through `argmax` (int32) could alias g's ints, which made
  // GCC reload them for every output.
  const int oh = g.out_h(), ow = g.out_w(), planes = g.batch * g.channels;
  const int in_h = g.in_h, in_w = g.in_w, kernel_h = g.kernel_h, kernel_w = g.kernel_w;
  const int stride_h = g.stride_h, stride_w = g.stride_w, pad_h = g.padding_h, pad_w = g.padding_w;
  const bool two_by_two =
      kernel_h == 2 && kernel_w == 2 && stride_h == 2 && stride_w == 2 && pad_h == 0 && pad_w == 0;
#pragma omp parallel for num_threads(threads_) if (int64_t{planes} * in_h * in_w > kParallelMin)
  for (int p = 0; p < planes; ++p) {
    const float* __restrict in = x + static_cast<int64_t>(p) * in_h * in_w;
    float* __restrict out = y + static_cast<int64_t>(p) * oh * ow;
    int32_t* __restrict am = argmax + static_cast<int64_t>(p) * oh * ow;
    for (int i = 0; i < oh; ++i) {
      if (two_by_two) {
        // Window (a, b) in PyTorch's scan order: (0,0), (0,1), (1,0), (1,1); a later one wins
        // by MaxPoolTakes (greater, or NaN), as in PyTorch. Written as selects:
        // with random data, branches would mispredict half the time.
        const int top = 2 * i * in_w;
        const float* r0 = in + top;
        const float* r1 = r0 + in_w;
#pragma omp simd
        for (int j = 0; j < ow; ++j) {
          const int q0 = top + 2 * j;
          float best_v = r0[2 * j];
          int best = q0;
          const float v1 = r0[2 * j + 1], v2 = r1[2 * j], v3 = r1[2 * j + 1];
          const bool t1 = MaxPoolTakes(v1, best_v);
          best = t1 ? q0 + 1 : best;
          best_v = t1 ? v1 : best_v;
          const bool t2 = MaxPoolTakes(v2, best_v);
          best = t2 ? q0 + in_w : best;
          best_v = t2 ? v2 : best_v;
          const bool t3 = MaxPoolTakes(v3, best_v);
          best = t3 ? q0 + in_w + 1 : best;
          best_v = t3 ? v3 : best_v;
          out[i * ow + j] = best_v;
          am[i * ow + j] = best;
        }
        continue;
      }
      // The window clipped to the input: padded positions never win.
      const PoolSpan rows = PoolWindow(i, stride_h, pad_h, kernel_h, in_h);
      for (int j = 0; j < ow; ++j) {
        const PoolSpan cols = PoolWindow(j, stride_w, pad_w, kernel_w, in_w);
        int best = rows.lo * in_w + cols.lo;
        float best_v = in[best];
        for (int a = rows.lo; a < rows.hi; ++a) {
          for (int b = cols.lo; b < cols.hi; ++b) {
            const int q = a * in_w + b;
            if (MaxPoolTakes(in[q], best_v)) best_v = in[best = q];
          }
        }
        out[i * ow + j] = best_v;
        am[i * ow + j] = best;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::MaxPool2dBackward(const Pool2dGeometry& g, const float* dy,
                                           const int32_t* argmax, float* dx) {
  if (absl::Status s = CheckMaxPool2d(g); !s.ok()) return s;
  const int ohw = g.out_h() * g.out_w(), planes = g.batch * g.channels;
  const int in_hw = g.in_h * g.in_w;
#pragma omp parallel for num_threads(threads_) if (int64_t{planes} * in_hw > kParallelMin)
  for (int p = 0; p < planes; ++p) {
    float* d = dx + static_cast<int64_t>(p) * in_hw;
    std::memset(d, 0, sizeof(float) * in_hw);
    const float* src = dy + static_cast<int64_t>(p) * ohw;
    const int32_t* am = argmax + static_cast<int64_t>(p) * ohw;
    for (int i = 0; i < ohw; ++i) d[am[i]] += src[i];
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::AvgPool2dForward(const Pool2dGeometry& g, const float* x, float* y) {
  if (absl::Status s = CheckAvgPool2d(g, *this); !s.ok()) return s;
  if (g.layout == ImageLayout::kNchw16c) {
    cpu_internal::AvgPoolNchw16cForward(g, x, y, threads_);
    return absl::OkStatus();
  }
  const int oh = g.out_h(), ow = g.out_w(), planes = g.batch * g.channels;
  const int in_h = g.in_h, in_w = g.in_w, kernel_h = g.kernel_h, kernel_w = g.kernel_w;
  const int stride_h = g.stride_h, stride_w = g.stride_w, pad_h = g.padding_h, pad_w = g.padding_w;
  // Floor mode keeps every window inside the padded input: the divisor is the whole window.
  const float divisor = static_cast<float>(kernel_h * kernel_w);
#pragma omp parallel for num_threads(threads_) if (int64_t{planes} * in_h * in_w > kParallelMin)
  for (int p = 0; p < planes; ++p) {
    const float* in = x + static_cast<int64_t>(p) * in_h * in_w;
    float* out = y + static_cast<int64_t>(p) * oh * ow;
    for (int i = 0; i < oh; ++i) {
      const PoolSpan rows = PoolWindow(i, stride_h, pad_h, kernel_h, in_h);
      for (int j = 0; j < ow; ++j) {
        const PoolSpan cols = PoolWindow(j, stride_w, pad_w, kernel_w, in_w);
        float sum = 0.0f;
        for (int a = rows.lo; a < rows.hi; ++a) {
          for (int b = cols.lo; b < cols.hi; ++b) sum += in[a * in_w + b];
        }
        out[i * ow + j] = sum / divisor;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::AvgPool2dBackward(const Pool2dGeometry& g, const float* dy, float* dx) {
  if (absl::Status s = CheckAvgPool2d(g, *this); !s.ok()) return s;
  if (g.layout == ImageLayout::kNchw16c) {
    cpu_internal::AvgPoolNchw16cBackward(g, dy, dx, threads_);
    return absl::OkStatus();
  }
  const int oh = g.out_h(), ow = g.out_w(), planes = g.batch * g.channels;
  const int in_h = g.in_h, in_w = g.in_w, kernel_h = g.kernel_h, kernel_w = g.kernel_w;
  const int stride_h = g.stride_h, stride_w = g.stride_w, pad_h = g.padding_h, pad_w = g.padding_w;
  const float divisor = static_cast<float>(kernel_h * kernel_w);
#pragma omp parallel for num_threads(threads_) if (int64_t{planes} * in_h * in_w > kParallelMin)
  for (int p = 0; p < planes; ++p) {
    float* d = dx + static_cast<int64_t>(p) * in_h * in_w;
    std::memset(d, 0, sizeof(float) * in_h * in_w);
    const float* src = dy + static_cast<int64_t>(p) * oh * ow;
    // Windows in output order, so each pixel sums its windows' shares in the order the CUDA
    // kernel (which gathers per pixel) does.
    for (int i = 0; i < oh; ++i) {
      const PoolSpan rows = PoolWindow(i, stride_h, pad_h, kernel_h, in_h);
      for (int j = 0; j < ow; ++j) {
        const PoolSpan cols = PoolWindow(j, stride_w, pad_w, kernel_w, in_w);
        const float share = src[i * ow + j] / divisor;
        for (int a = rows.lo; a < rows.hi; ++a) {
          for (int b = cols.lo; b < cols.hi; ++b) d[a * in_w + b] += share;
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln
