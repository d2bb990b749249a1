#include "engine/cpu/nchw16c.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/cpu/cpu_parallel.h"
#include "engine/pool_window.h"

namespace kiln::cpu_internal {
namespace {

constexpr int kLanes = 16;

// A channel's sums run over kSampleRanges fixed ranges of samples, each summed in order and the
// ranges added in order: the bits do not depend on the thread count, and a block of 16 channels
// still splits into enough pieces of work for the threads.
constexpr int kSampleRanges = 8;

int Blocks(int channels) { return channels / kLanes; }

// Offset of (sample n, channel block cb, position s) in an nChw16c tensor of `blocks` blocks.
inline int64_t At(int64_t n, int blocks, int cb, int64_t s, int64_t hw) {
  return ((n * blocks + cb) * hw + s) * kLanes;
}

// sums[k * channels + c] = the sum over every (sample, position) of channel c of what
// add(offset, block, acc) accumulates into acc[k][lane] from the 16 lanes of channel block `block`
// at `offset`: kSums sums per channel, in double.
template <int kSums, typename AddFn>
void ChannelSums(const BatchNormGeometry& g, int threads, const AddFn& add, double* sums) {
  const int blocks = Blocks(g.channels);
  const int items = blocks * kSampleRanges;
  std::vector<double> partial(static_cast<size_t>(items) * kSums * kLanes, 0.0);
  const int64_t work = g.values_per_channel() * g.channels;
#pragma omp parallel for num_threads(threads) schedule(static) if (work > kParallelMin)
  for (int item = 0; item < items; ++item) {
    const int cb = item / kSampleRanges, range = item % kSampleRanges;
    const int lo = static_cast<int>(int64_t{g.batch} * range / kSampleRanges);
    const int hi = static_cast<int>(int64_t{g.batch} * (range + 1) / kSampleRanges);
    double acc[kSums][kLanes] = {};
    for (int n = lo; n < hi; ++n) {
      for (int64_t s = 0; s < g.spatial; ++s) add(At(n, blocks, cb, s, g.spatial), cb, acc);
    }
    std::memcpy(&partial[static_cast<size_t>(item) * kSums * kLanes], acc, sizeof(acc));
  }
  for (int k = 0; k < kSums; ++k) {
    for (int c = 0; c < g.channels; ++c) sums[k * g.channels + c] = 0;
  }
  for (int item = 0; item < items; ++item) {
    const int cb = item / kSampleRanges;
    const double* p = &partial[static_cast<size_t>(item) * kSums * kLanes];
    for (int k = 0; k < kSums; ++k) {
      for (int j = 0; j < kLanes; ++j) sums[k * g.channels + cb * kLanes + j] += p[k * kLanes + j];
    }
  }
}

// y = x * scale[c] + shift[c] over every value, then max(0, y) as ReluForward where kRelu.
template <bool kRelu>
void ScaleShiftOf(const BatchNormGeometry& g, const float* scale, const float* shift,
                  const float* x, float* y, int threads) {
  const int blocks = Blocks(g.channels);
  const int64_t rows = int64_t{g.batch} * blocks;
#pragma omp parallel for num_threads(threads) \
    schedule(static) if (rows * g.spatial * kLanes > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const int cb = static_cast<int>(r % blocks);
    const float* sc = scale + cb * kLanes;
    const float* sh = shift + cb * kLanes;
    const float* __restrict in = x + r * g.spatial * kLanes;
    float* __restrict out = y + r * g.spatial * kLanes;
    for (int64_t s = 0; s < g.spatial; ++s) {
#pragma omp simd
      for (int j = 0; j < kLanes; ++j) {
        const float v = in[s * kLanes + j] * sc[j] + sh[j];
        out[s * kLanes + j] = kRelu ? (v > 0.0f ? v : 0.0f) : v;
      }
    }
  }
}

void ScaleShift(const BatchNormGeometry& g, const float* scale, const float* shift, const float* x,
                bool relu, float* y, int threads) {
  if (relu) {
    ScaleShiftOf<true>(g, scale, shift, x, y, threads);
  } else {
    ScaleShiftOf<false>(g, scale, shift, x, y, threads);
  }
}

}  // namespace

void NchwToNchw16c(int batch, int channels, int64_t hw, const float* src, float* dst, int threads) {
  const int blocks = Blocks(channels);
  const int64_t rows = int64_t{batch} * blocks;
#pragma omp parallel for num_threads(threads) \
    schedule(static) if (rows * hw * kLanes > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = src + r * kLanes * hw;  // 16 planes of block r, one after another
    float* out = dst + r * kLanes * hw;
    for (int j = 0; j < kLanes; ++j) {
      for (int64_t p = 0; p < hw; ++p) out[p * kLanes + j] = in[j * hw + p];
    }
  }
}

void Nchw16cToNchw(int batch, int channels, int64_t hw, const float* src, float* dst, int threads) {
  const int blocks = Blocks(channels);
  const int64_t rows = int64_t{batch} * blocks;
#pragma omp parallel for num_threads(threads) \
    schedule(static) if (rows * hw * kLanes > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = src + r * kLanes * hw;
    float* out = dst + r * kLanes * hw;
    for (int j = 0; j < kLanes; ++j) {
      for (int64_t p = 0; p < hw; ++p) out[j * hw + p] = in[p * kLanes + j];
    }
  }
}

// The statistics as the NCHW loops (norm_ops.cc) form them from the same sums.
void BatchNormNchw16cForwardTraining(const BatchNormGeometry& g, double eps, double momentum,
                                     const float* x, const float* gamma, const float* beta,
                                     bool relu, float* y, float* running_mean, float* running_var,
                                     float* saved_mean, float* saved_invstd, int threads) {
  const int channels = g.channels;
  const double n = static_cast<double>(g.values_per_channel());
  // One pass for both sums: each product of two floats is exact in double, so the squares'
  // sum less n * mean^2 loses only the double rounding of sums of that size (1e-16 of it), where
  // the NCHW loops' second pass over x costs another read of it (a third of the forward).
  std::vector<double> sums(2 * static_cast<size_t>(channels)), mean(channels), squares(channels);
  ChannelSums<2>(
      g, threads,
      [&](int64_t at, int /*block*/, double(*acc)[kLanes]) {
#pragma omp simd
        for (int j = 0; j < kLanes; ++j) {
          const double v = x[at + j];
          acc[0][j] += v;
          acc[1][j] += v * v;
        }
      },
      sums.data());
  for (int c = 0; c < channels; ++c) {
    mean[c] = sums[c] / n;
    squares[c] = std::max(sums[channels + c] - sums[c] * mean[c], 0.0);
  }
  std::vector<float> scale(channels), shift(channels);
  for (int c = 0; c < channels; ++c) {
    const double invstd = 1.0 / std::sqrt(squares[c] / n + eps);
    saved_mean[c] = static_cast<float>(mean[c]);
    saved_invstd[c] = static_cast<float>(invstd);
    running_mean[c] = static_cast<float>((1 - momentum) * running_mean[c] + momentum * mean[c]);
    running_var[c] =
        static_cast<float>((1 - momentum) * running_var[c] + momentum * (squares[c] / (n - 1)));
    const double s = gamma[c] * invstd;
    scale[c] = static_cast<float>(s);
    shift[c] = static_cast<float>(beta[c] - mean[c] * s);
  }
  ScaleShift(g, scale.data(), shift.data(), x, relu, y, threads);
}

void BatchNormNchw16cForwardInference(const BatchNormGeometry& g, double eps, const float* x,
                                      const float* gamma, const float* beta,
                                      const float* running_mean, const float* running_var,
                                      bool relu, float* y, int threads) {
  std::vector<float> scale(g.channels), shift(g.channels);
  for (int c = 0; c < g.channels; ++c) {
    const double s = gamma[c] / std::sqrt(static_cast<double>(running_var[c]) + eps);
    scale[c] = static_cast<float>(s);
    shift[c] = static_cast<float>(beta[c] - running_mean[c] * s);
  }
  ScaleShift(g, scale.data(), shift.data(), x, relu, y, threads);
}

namespace {

// BatchNormNchw16cBackward, with dy masked where relu_y is not positive when kRelu.
template <bool kRelu>
void BackwardOf(const BatchNormGeometry& g, const float* x, const float* gamma,
                const float* saved_mean, const float* saved_invstd, const float* relu_y,
                const float* dy, float* dgamma, float* dbeta, float* dx, int threads) {
  // dy as the ReLU's backward passes it on (both loads unconditional, as in ReluBackward).
  auto grad = [&](int64_t i) {
    const float d = dy[i];
    return kRelu ? (relu_y[i] > 0.0f ? d : 0.0f) : d;
  };
  const int channels = g.channels, blocks = Blocks(channels);
  const double n = static_cast<double>(g.values_per_channel());
  std::vector<double> mean(saved_mean, saved_mean + channels);
  std::vector<double> invstd(saved_invstd, saved_invstd + channels);
  std::vector<double> sums(2 * static_cast<size_t>(channels));  // sum(dy), then sum(dy * xhat)
  ChannelSums<2>(
      g, threads,
      [&](int64_t at, int block, double(*acc)[kLanes]) {
        const int c0 = block * kLanes;
        const double* m = mean.data() + c0;
        const double* is = invstd.data() + c0;
        // The 16 gradients first: a select inside the double accumulation did not vectorise.
        float d[kLanes];
#pragma omp simd
        for (int j = 0; j < kLanes; ++j) d[j] = grad(at + j);
#pragma omp simd
        for (int j = 0; j < kLanes; ++j) {
          acc[0][j] += d[j];
          acc[1][j] += d[j] * (x[at + j] - m[j]) * is[j];
        }
      },
      sums.data());
  // dx = gamma * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)), in float as norm_ops.cc.
  std::vector<float> k(channels), mean_dy(channels), mean_dy_xhat(channels), m(channels),
      is(channels);
  for (int c = 0; c < channels; ++c) {
    const double sum_dy = sums[c], sum_dy_xhat = sums[channels + c];
    dgamma[c] += static_cast<float>(sum_dy_xhat);
    dbeta[c] += static_cast<float>(sum_dy);
    k[c] = static_cast<float>(gamma[c] * invstd[c]);
    mean_dy[c] = static_cast<float>(sum_dy / n);
    mean_dy_xhat[c] = static_cast<float>(sum_dy_xhat / n);
    m[c] = static_cast<float>(mean[c]);
    is[c] = static_cast<float>(invstd[c]);
  }
  if (dx == nullptr) return;
  const int64_t rows = int64_t{g.batch} * blocks;
#pragma omp parallel for num_threads(threads) \
    schedule(static) if (rows * g.spatial * kLanes > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const int c0 = static_cast<int>(r % blocks) * kLanes;
    const float *kc = &k[c0], *mdy = &mean_dy[c0], *mdx = &mean_dy_xhat[c0], *mc = &m[c0],
                *isc = &is[c0];
    const int64_t base = r * g.spatial * kLanes;
    const float* __restrict in = x + base;
    float* __restrict out = dx + base;
    for (int64_t s = 0; s < g.spatial; ++s) {
#pragma omp simd
      for (int j = 0; j < kLanes; ++j) {
        const int64_t i = s * kLanes + j;
        out[i] = kc[j] * (grad(base + i) - mdy[j] - (in[i] - mc[j]) * isc[j] * mdx[j]);
      }
    }
  }
}

}  // namespace

void BatchNormNchw16cBackward(const BatchNormGeometry& g, const float* x, const float* gamma,
                              const float* saved_mean, const float* saved_invstd,
                              const float* relu_y, const float* dy, float* dgamma, float* dbeta,
                              float* dx, int threads) {
  if (relu_y != nullptr) {
    BackwardOf<true>(g, x, gamma, saved_mean, saved_invstd, relu_y, dy, dgamma, dbeta, dx, threads);
  } else {
    BackwardOf<false>(g, x, gamma, saved_mean, saved_invstd, nullptr, dy, dgamma, dbeta, dx,
                      threads);
  }
}

void AvgPoolNchw16cForward(const Pool2dGeometry& g, const float* x, float* y, int threads) {
  const int oh = g.out_h(), ow = g.out_w(), blocks = Blocks(g.channels);
  const int64_t in_hw = int64_t{g.in_h} * g.in_w, out_hw = int64_t{oh} * ow;
  const int64_t rows = int64_t{g.batch} * blocks;
  // As the NCHW loop: each window summed from 0 in scan order, divided by the whole window.
  const float divisor = static_cast<float>(g.kernel_h * g.kernel_w);
#pragma omp parallel for num_threads(threads) \
    schedule(static) if (rows * in_hw * kLanes > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * in_hw * kLanes;
    float* out = y + r * out_hw * kLanes;
    for (int i = 0; i < oh; ++i) {
      const PoolSpan span_h = PoolWindow(i, g.stride_h, g.padding_h, g.kernel_h, g.in_h);
      for (int j = 0; j < ow; ++j) {
        const PoolSpan span_w = PoolWindow(j, g.stride_w, g.padding_w, g.kernel_w, g.in_w);
        float sum[kLanes] = {};
        for (int a = span_h.lo; a < span_h.hi; ++a) {
          for (int b = span_w.lo; b < span_w.hi; ++b) {
            const float* p = in + (int64_t{a} * g.in_w + b) * kLanes;
#pragma omp simd
            for (int l = 0; l < kLanes; ++l) sum[l] += p[l];
          }
        }
        float* o = out + (int64_t{i} * ow + j) * kLanes;
#pragma omp simd
        for (int l = 0; l < kLanes; ++l) o[l] = sum[l] / divisor;
      }
    }
  }
}

void AvgPoolNchw16cBackward(const Pool2dGeometry& g, const float* dy, float* dx, int threads) {
  const int oh = g.out_h(), ow = g.out_w(), blocks = Blocks(g.channels);
  const int64_t in_hw = int64_t{g.in_h} * g.in_w, out_hw = int64_t{oh} * ow;
  const int64_t rows = int64_t{g.batch} * blocks;
  const float divisor = static_cast<float>(g.kernel_h * g.kernel_w);
#pragma omp parallel for num_threads(threads) \
    schedule(static) if (rows * in_hw * kLanes > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dx + r * in_hw * kLanes;
    std::memset(d, 0, sizeof(float) * in_hw * kLanes);
    const float* src = dy + r * out_hw * kLanes;
    // Windows in output order, as the NCHW loop adds them.
    for (int i = 0; i < oh; ++i) {
      const PoolSpan span_h = PoolWindow(i, g.stride_h, g.padding_h, g.kernel_h, g.in_h);
      for (int j = 0; j < ow; ++j) {
        const PoolSpan span_w = PoolWindow(j, g.stride_w, g.padding_w, g.kernel_w, g.in_w);
        float share[kLanes];
        const float* s = src + (int64_t{i} * ow + j) * kLanes;
#pragma omp simd
        for (int l = 0; l < kLanes; ++l) share[l] = s[l] / divisor;
        for (int a = span_h.lo; a < span_h.hi; ++a) {
          for (int b = span_w.lo; b < span_w.hi; ++b) {
            float* p = d + (int64_t{a} * g.in_w + b) * kLanes;
#pragma omp simd
            for (int l = 0; l < kLanes; ++l) p[l] += share[l];
          }
        }
      }
    }
  }
}

}  // namespace kiln::cpu_internal
