// Convolution by im2col and OpenBLAS sgemm, one GEMM per sample, the samples spread over the
// threads: the CPU backend's fallback for the geometries oneDNN has only its reference kernel for
// (a kernel or padding beyond its JIT kernels' limits, where the reference kernel takes hours).
#include "engine/cpu/im2col_conv.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "engine/backend_checks.h"
#include "engine/cpu/cpu_parallel.h"
#include "engine/pool_window.h"

namespace kiln::cpu_internal {
namespace {

// Eight floats at any alignment, moved as one 32-byte load and store (GCC and Clang vector
// extension); memcpy(.., 32) compiled to two 16-byte moves.
typedef float UnalignedFloat8 __attribute__((vector_size(32), aligned(4), may_alias));

// Copies n floats in 8-float blocks, the last one overlapping the one before: branch-light for
// the short rows of small images (11 floats for the reference CNN's second conv), where a memcpy
// call per row cost 2.5x as much.
inline void CopyRow(float* dst, const float* src, int n) {
  if (n < 8) {
    for (int j = 0; j < n; ++j) dst[j] = src[j];
    return;
  }
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    *reinterpret_cast<UnalignedFloat8*>(dst + j) =
        *reinterpret_cast<const UnalignedFloat8*>(src + j);
  }
  if (j < n) {
    *reinterpret_cast<UnalignedFloat8*>(dst + n - 8) =
        *reinterpret_cast<const UnalignedFloat8*>(src + n - 8);
  }
}

// [lo, hi) of the n output positions whose input position (output + offset) lies in [0, size).
void ValidRange(int n, int offset, int size, int* lo, int* hi) {
  *lo = std::min(n, std::max(0, -offset));
  *hi = std::max(*lo, std::min(n, size - offset));
}

// im2col of one sample: cols is (C*KH*KW, OH*OW), so one GEMM with the (OC, C*KH*KW) weights
// convolves it straight into the sample's (OC, OH*OW) output plane, already in NCHW order.
void Im2Col(const Conv2dGeometry& g, const float* x, float* cols) {
  const int oh = g.out_h(), ow = g.out_w(), ohw = oh * ow;
  const int in_h = g.in_h, in_w = g.in_w, stride_h = g.stride_h, stride_w = g.stride_w;
  const int pad_h = g.padding_h, pad_w = g.padding_w;
  const int kernel_h = g.kernel_h, kernel_w = g.kernel_w;
  const int rows = g.in_channels * kernel_h * kernel_w;
  for (int r = 0; r < rows; ++r) {
    const int kw = r % kernel_w, kh = (r / kernel_w) % kernel_h, c = r / (kernel_w * kernel_h);
    const float* plane = x + static_cast<int64_t>(c) * in_h * in_w;
    float* out = cols + static_cast<int64_t>(r) * ohw;
    if (stride_h == 1 && stride_w == 1) {
      // Row r is the input plane shifted by (kh - pad_h, kw - pad_w): the rows and columns that
      // fall outside it are zeros, the rest contiguous runs. Bounds once per r, not per output row.
      const int y0 = kh - pad_h, x0 = kw - pad_w;
      int i0, i1, j0, j1;
      ValidRange(oh, y0, in_h, &i0, &i1);
      ValidRange(ow, x0, in_w, &j0, &j1);
      std::memset(out, 0, sizeof(float) * i0 * ow);
      for (int i = i0; i < i1; ++i) {
        float* o = out + i * ow;
        const float* row = plane + static_cast<int64_t>(i + y0) * in_w;
        for (int j = 0; j < j0; ++j) o[j] = 0;
        CopyRow(o + j0, row + x0 + j0, j1 - j0);
        for (int j = j1; j < ow; ++j) o[j] = 0;
      }
      std::memset(out + i1 * ow, 0, sizeof(float) * (oh - i1) * ow);
      continue;
    }
    for (int i = 0; i < oh; ++i) {
      const int y = i * stride_h - pad_h + kh;
      float* o = out + i * ow;
      if (y < 0 || y >= in_h) {
        std::memset(o, 0, sizeof(float) * ow);
        continue;
      }
      const float* row = plane + y * in_w;
      for (int j = 0; j < ow; ++j) {
        const int xx = j * stride_w - pad_w + kw;
        o[j] = (xx >= 0 && xx < in_w) ? row[xx] : 0.0f;
      }
    }
  }
}

// col2im of one sample: dx = scatter-add of dcols (C*KH*KW, OH*OW), in a fixed order.
void Col2Im(const Conv2dGeometry& g, const float* cols, float* dx) {
  const int oh = g.out_h(), ow = g.out_w(), ohw = oh * ow;
  std::memset(dx, 0, sizeof(float) * g.in_channels * g.in_h * g.in_w);
  const int rows = g.in_channels * g.kernel_h * g.kernel_w;
  for (int r = 0; r < rows; ++r) {
    const int kw = r % g.kernel_w, kh = (r / g.kernel_w) % g.kernel_h;
    const int c = r / (g.kernel_w * g.kernel_h);
    float* plane = dx + static_cast<int64_t>(c) * g.in_h * g.in_w;
    const float* in = cols + static_cast<int64_t>(r) * ohw;
    for (int i = 0; i < oh; ++i) {
      const int y = i * g.stride_h - g.padding_h + kh;
      if (y < 0 || y >= g.in_h) continue;
      float* row = plane + y * g.in_w;
      const float* src = in + i * ow;
      if (g.stride_w == 1) {
        const int x0 = kw - g.padding_w;
        int j0, j1;
        ValidRange(ow, x0, g.in_w, &j0, &j1);
        float* dst = row + x0 + j0;
        const float* from = src + j0;
#pragma omp simd
        for (int j = 0; j < j1 - j0; ++j) dst[j] += from[j];
      } else {
        for (int j = 0; j < ow; ++j) {
          const int xx = j * g.stride_w - g.padding_w + kw;
          if (xx >= 0 && xx < g.in_w) row[xx] += src[j];
        }
      }
    }
  }
}

// The convolution's output positions that a fused max pooling reads (CheckFusableMaxPool:
// windows of pool.kernel_h x kernel_w, stride the same), window position by window position:
// column p * windows + q is position p = (a, b) of window q = (i, j), which is output
// (i * kernel_h + a, j * kernel_w + b). So each position's outputs are one contiguous run, which
// the pooling and its backward take in whole vectors. Outputs outside every window are left out:
// they are never pooled, and their gradient is zero.
struct WindowOrder {
  explicit WindowOrder(const Pool2dGeometry& pool)
      : kernel_h(pool.kernel_h),
        kernel_w(pool.kernel_w),
        out_h(pool.out_h()),
        out_w(pool.out_w()),
        positions(kernel_h * kernel_w),
        windows(out_h * out_w) {}
  int kernel_h, kernel_w, out_h, out_w;
  int positions, windows;
  int64_t columns() const { return int64_t{positions} * windows; }
};

// Calls f(column run, input row, first input column, step) for each (im2col row r, position,
// window row i) whose input row lies inside the plane (`row` < 0 otherwise): the run's window
// columns j read input columns first + j * step.
template <typename F>
void ForEachWindowRun(const Conv2dGeometry& g, const WindowOrder& o, int r, F f) {
  const int kw = r % g.kernel_w, kh = (r / g.kernel_w) % g.kernel_h;
  const int step = o.kernel_w * g.stride_w;
  for (int a = 0; a < o.kernel_h; ++a) {
    for (int b = 0; b < o.kernel_w; ++b) {
      const int64_t run0 = int64_t{a * o.kernel_w + b} * o.windows;
      for (int i = 0; i < o.out_h; ++i) {
        const int y = (i * o.kernel_h + a) * g.stride_h - g.padding_h + kh;
        const int first = b * g.stride_w - g.padding_w + kw;
        f(run0 + int64_t{i} * o.out_w, (y < 0 || y >= g.in_h) ? -1 : y, first, step);
      }
    }
  }
}

// [lo, hi) of the n window columns j whose input column first + j * step lies in [0, size).
void ValidStridedRange(int n, int first, int step, int size, int* lo, int* hi) {
  *lo = first >= 0 ? 0 : std::min(n, (-first + step - 1) / step);
  *hi = first >= size ? *lo : std::max(*lo, std::min(n, (size - first + step - 1) / step));
}

// im2col of one sample in window order: cols is (C*KH*KW, o.columns()).
void WindowIm2Col(const Conv2dGeometry& g, const WindowOrder& o, const float* x, float* cols) {
  const int rows = g.in_channels * g.kernel_h * g.kernel_w;
  for (int r = 0; r < rows; ++r) {
    const float* plane = x + static_cast<int64_t>(r / (g.kernel_w * g.kernel_h)) * g.in_h * g.in_w;
    float* out = cols + r * o.columns();
    ForEachWindowRun(g, o, r, [&](int64_t run, int y, int first, int step) {
      float* dst = out + run;
      if (y < 0) {
        std::fill_n(dst, o.out_w, 0.0f);
        return;
      }
      const float* src = plane + static_cast<int64_t>(y) * g.in_w + first;
      int lo, hi;
      ValidStridedRange(o.out_w, first, step, g.in_w, &lo, &hi);
      for (int j = 0; j < lo; ++j) dst[j] = 0.0f;
      if (step == 2) {  // 2-wide windows at stride 1 (the reference CNN): a constant stride
        for (int j = lo; j < hi; ++j) dst[j] = src[2 * j];
      } else {
        for (int j = lo; j < hi; ++j) dst[j] = src[j * step];
      }
      for (int j = hi; j < o.out_w; ++j) dst[j] = 0.0f;
    });
  }
}

// col2im of one sample from window order: dx = scatter-add of dcols, in a fixed order.
void WindowCol2Im(const Conv2dGeometry& g, const WindowOrder& o, const float* cols, float* dx) {
  std::memset(dx, 0, sizeof(float) * g.in_channels * g.in_h * g.in_w);
  const int rows = g.in_channels * g.kernel_h * g.kernel_w;
  for (int r = 0; r < rows; ++r) {
    float* plane = dx + static_cast<int64_t>(r / (g.kernel_w * g.kernel_h)) * g.in_h * g.in_w;
    const float* in = cols + r * o.columns();
    ForEachWindowRun(g, o, r, [&](int64_t run, int y, int first, int step) {
      if (y < 0) return;
      float* dst = plane + static_cast<int64_t>(y) * g.in_w + first;
      int lo, hi;
      ValidStridedRange(o.out_w, first, step, g.in_w, &lo, &hi);
      for (int j = lo; j < hi; ++j) dst[j * step] += in[run + j];
    });
  }
}

// The calling thread's buffer of n values of T (for loops over the winners as ints: loops that
// mix bytes with floats compile to scalar code).
template <typename T>
T* ThreadBuffer(int64_t n) {
  static thread_local std::vector<T> buffer;
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(static_cast<size_t>(n));
  return buffer.data();
}

// The pooling of one sample's output in window order (oc rows of o.columns()): y and winners
// (plain, o.windows per channel) by MaxPool2dForward's rule, scan order being position order.
void PoolWindows(const WindowOrder& o, int channels, const float* out, bool relu, float* y,
                 uint8_t* winners) {
  const int64_t windows = o.windows;
  int* __restrict index = ThreadBuffer<int>(windows);
  for (int c = 0; c < channels; ++c) {
    const float* __restrict in = out + c * o.columns();
    float* __restrict best = y + c * windows;
    uint8_t* __restrict win = winners + c * windows;
#pragma omp simd
    for (int64_t q = 0; q < windows; ++q) {
      best[q] = in[q];
      index[q] = 0;
    }
    for (int p = 1; p < o.positions; ++p) {
      const float* __restrict v = in + p * windows;
#pragma omp simd
      for (int64_t q = 0; q < windows; ++q) {
        const bool wins = MaxPoolTakes(v[q], best[q]);
        best[q] = wins ? v[q] : best[q];
        index[q] = wins ? p : index[q];
      }
    }
    // The ReLU's backward passes nothing where the winner is not positive.
#pragma omp simd simdlen(8)
    for (int64_t q = 0; q < windows; ++q) {
      win[q] = relu && !(best[q] > 0.0f) ? kMaskedWinner : static_cast<uint8_t>(index[q]);
    }
  }
}

// The pooling's backward for one sample, into window order: each window's dy at its winner's
// position (0 + dy, as MaxPool2dBackward's scatter into zeros gives), zeros elsewhere.
void UnpoolWindows(const WindowOrder& o, int channels, const uint8_t* winners, const float* dy,
                   float* grad) {
  const int64_t windows = o.windows;
  int* __restrict index = ThreadBuffer<int>(windows);
  float* __restrict grads = ThreadBuffer<float>(windows);
  for (int c = 0; c < channels; ++c) {
    const uint8_t* __restrict win = winners + c * windows;
    const float* __restrict d = dy + c * windows;
#pragma omp simd simdlen(8)
    for (int64_t q = 0; q < windows; ++q) {
      index[q] = win[q];
      grads[q] = 0.0f + d[q];  // here: GCC leaves a select of `0.0f + d[q]` scalar
    }
    for (int p = 0; p < o.positions; ++p) {
      float* __restrict out = grad + c * o.columns() + p * windows;
#pragma omp simd
      for (int64_t q = 0; q < windows; ++q) out[q] = index[q] == p ? grads[q] : 0.0f;
    }
  }
}

}  // namespace

Im2colScratch Im2colScratchFloats(const Conv2dGeometry& g, int threads, bool backward,
                                  bool pooled) {
  const int64_t ohw = int64_t{g.out_h()} * g.out_w();
  const int64_t k = int64_t{g.in_channels} * g.kernel_h * g.kernel_w;
  const int64_t team = SampleThreads(g.batch, threads);
  const int64_t out_elems = int64_t{g.out_channels} * ohw;
  Im2colScratch s;
  if (!backward) {
    s.columns = team * (k * ohw + (pooled ? out_elems : 0));
    return s;
  }
  s.columns = team * (2 * k * ohw + out_elems);
  s.partials = team * (int64_t{g.out_channels} * k + g.out_channels);
  return s;
}

void Im2colConv2dForward(const Conv2dGeometry& g, const float* x, const float* w, const float* bias,
                         Activation act, float* y, int threads, float* scratch,
                         const Pool2dGeometry* pool, uint8_t* winners) {
  const int ohw = g.out_h() * g.out_w();
  const int k = g.in_channels * g.kernel_h * g.kernel_w;
  const int64_t in_elems = int64_t{g.in_channels} * g.in_h * g.in_w;
  const int64_t out_elems = int64_t{g.out_channels} * ohw;
  const int64_t pooled_elems =
      pool != nullptr ? int64_t{g.out_channels} * pool->out_h() * pool->out_w() : 0;
  const int team = SampleThreads(g.batch, threads);
  // A thread's scratch: the columns, then (pooled) the sample's output.
  const int64_t per_thread = int64_t{k} * ohw + (pool != nullptr ? out_elems : 0);
  // With a pooling, the sample's output in window order (WindowOrder), pooled in cache.
  const std::optional<WindowOrder> order =
      pool != nullptr ? std::optional<WindowOrder>(*pool) : std::nullopt;
  const int columns = order ? static_cast<int>(order->columns()) : ohw;
  auto sample = [&](int n, float* cols) {
    float* yn = order ? cols + int64_t{k} * ohw : y + n * out_elems;
    if (order) {
      WindowIm2Col(g, *order, x + n * in_elems, cols);
    } else {
      Im2Col(g, x + n * in_elems, cols);
    }
    // y_n (OC, columns) = w (OC, K) * cols (K, columns)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g.out_channels, columns, k, 1.0f, w, k,
                cols, columns, 0.0f, yn, columns);
    // Bias and activation while the sample's output is still in cache.
    const bool relu = act == Activation::kRelu;
    for (int oc = 0; oc < g.out_channels; ++oc) {
      float* row = yn + int64_t{oc} * columns;
      const float b = bias != nullptr ? bias[oc] : 0.0f;
#pragma omp simd
      for (int i = 0; i < columns; ++i) {
        const float v = row[i] + b;
        row[i] = relu && v < 0.0f ? 0.0f : v;
      }
    }
    if (order) {
      PoolWindows(*order, g.out_channels, yn, relu, y + n * pooled_elems,
                  winners + n * pooled_elems);
    }
  };
  if (team == 1) {
    // One sample (or one thread): on the calling thread, outside any parallel region, so the
    // GEMM gets OpenBLAS's whole team. Inside a team of one it forks a nested team instead, which
    // measured badly: batch-1 CNN inference 516 img/s with p90 8 ms, against 8,088 and 0.13 ms.
    for (int n = 0; n < g.batch; ++n) sample(n, scratch);
    return;
  }
  // One single-threaded GEMM per sample, samples spread over the team: each sample's columns
  // stay in cache and its output needs no transpose. (Inside a parallel region the OpenMP
  // OpenBLAS runs single-threaded.)
#pragma omp parallel num_threads(team)
  {
    float* cols = scratch + omp_get_thread_num() * per_thread;
#pragma omp for schedule(static)
    for (int n = 0; n < g.batch; ++n) sample(n, cols);
  }
}

void Im2colConv2dBackward(const Conv2dGeometry& g, const float* x, const float* w, const float* y,
                          const float* dy, Activation act, float* dw, float* dbias, float* dx,
                          int threads, float* scratch, const Pool2dGeometry* pool,
                          const uint8_t* winners) {
  const int ohw = g.out_h() * g.out_w();
  const int k = g.in_channels * g.kernel_h * g.kernel_w;
  const int64_t in_elems = int64_t{g.in_channels} * g.in_h * g.in_w;
  const int64_t out_elems = int64_t{g.out_channels} * ohw;
  const int64_t w_elems = int64_t{g.out_channels} * k;
  const int team = SampleThreads(g.batch, threads);
  // Per thread: im2col columns, their gradient, and the sample's masked output gradient.
  const int64_t per_thread = 2 * int64_t{k} * ohw + out_elems;
  // With a pooling: window order (WindowOrder), the pooling's backward expanded in cache.
  const std::optional<WindowOrder> order =
      pool != nullptr ? std::optional<WindowOrder>(*pool) : std::nullopt;
  const int columns = order ? static_cast<int>(order->columns()) : ohw;
  // Per-thread partial weight and bias gradients (after the columns), summed in thread order.
  float* partial = scratch + Im2colScratchFloats(g, threads, /*backward=*/true).columns;
  std::fill_n(partial, team * (w_elems + g.out_channels), 0.0f);
  // Sample n's gradients, with thread t's scratch and partial sums.
  auto sample = [&](int n, int t) {
    float* cols = scratch + t * per_thread;
    float* dcols = cols + int64_t{k} * ohw;
    float* masked = dcols + int64_t{k} * ohw;
    float* dw_t = partial + t * (w_elems + g.out_channels);
    float* db_t = dw_t + w_elems;
    const float* dyn = dy + n * out_elems;
    if (order) {
      // The pooled gradient at each window's winner (the ReLU's mask included), window order.
      const int64_t pooled = int64_t{g.out_channels} * order->windows;
      UnpoolWindows(*order, g.out_channels, winners + n * pooled, dy + n * pooled, masked);
      dyn = masked;
    } else if (act == Activation::kRelu) {
      // The fused ReLU's backward: pass the gradient where the output was positive.
      const float* yn = y + n * out_elems;
#pragma omp simd
      for (int64_t i = 0; i < out_elems; ++i) {
        const float d = dyn[i];
        masked[i] = yn[i] > 0.0f ? d : 0.0f;
      }
      dyn = masked;
    }
    if (order) {
      WindowIm2Col(g, *order, x + n * in_elems, cols);
    } else {
      Im2Col(g, x + n * in_elems, cols);
    }
    // dw (OC, K) += dy_n (OC, columns) * cols^T (columns, K)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g.out_channels, k, columns, 1.0f, dyn,
                columns, cols, columns, 1.0f, dw_t, k);
    for (int oc = 0; oc < g.out_channels; ++oc) {
      const float* row = dyn + int64_t{oc} * columns;
      float sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int i = 0; i < columns; ++i) sum += row[i];
      db_t[oc] += sum;
    }
    if (dx != nullptr) {
      // dcols (K, columns) = w^T (K, OC) * dy_n (OC, columns), then scattered back to the input.
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k, columns, g.out_channels, 1.0f, w, k,
                  dyn, columns, 0.0f, dcols, columns);
      if (order) {
        WindowCol2Im(g, *order, dcols, dx + n * in_elems);
      } else {
        Col2Im(g, dcols, dx + n * in_elems);
      }
    }
  };
  if (team == 1) {
    // As in Conv2dForward: no team of one around OpenBLAS's own threads.
    for (int n = 0; n < g.batch; ++n) sample(n, 0);
  } else {
#pragma omp parallel num_threads(team)
    {
      const int t = omp_get_thread_num();
#pragma omp for schedule(static)
      for (int n = 0; n < g.batch; ++n) sample(n, t);
    }
  }
  for (int t = 0; t < team; ++t) {
    const float* dw_t = partial + t * (w_elems + g.out_channels);
#pragma omp simd
    for (int64_t i = 0; i < w_elems; ++i) dw[i] += dw_t[i];
    if (dbias != nullptr) {
      for (int oc = 0; oc < g.out_channels; ++oc) dbias[oc] += dw_t[w_elems + oc];
    }
  }
}

}  // namespace kiln::cpu_internal
