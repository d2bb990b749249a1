#include "engine/cpu/fused_max_pool.h"

#include <cstring>
#include <type_traits>
#include <vector>

#include "engine/backend_checks.h"
#include "engine/cpu/bf16.h"
#include "engine/cpu/cpu_parallel.h"
#include "engine/pool_window.h"

namespace kiln::cpu_internal {
namespace {

constexpr int kBlock = 16;

// The byte recorded for a window: its winner's position, or kMaskedWinner where the fused ReLU's
// backward passes nothing (the winner, a ReLU output, is not positive).
inline uint8_t WinnerByte(float value, int index, bool relu) {
  return relu && !(value > 0.0f) ? kMaskedWinner : static_cast<uint8_t>(index);
}

// What MaxPool2dBackward leaves at a winner: 0 + dy (the scatter adds into zeros, which turns a
// -0 into +0).
inline float WinnerGrad(float dy) { return 0.0f + dy; }

// The plain passes over `planes` consecutive planes of g's (pointers at the first one).
void MaxPoolPlainForwardPlanes(const Pool2dGeometry& g, const float* x, bool relu, float* y,
                               uint8_t* winners, int64_t planes) {
  const int oh = g.out_h(), ow = g.out_w(), kh = g.kernel_h, kw = g.kernel_w;
  const int64_t in_h = g.in_h, in_w = g.in_w;
  for (int64_t p = 0; p < planes; ++p) {
    const float* __restrict in = x + p * in_h * in_w;
    float* __restrict out = y + p * oh * ow;
    uint8_t* __restrict win = winners + p * oh * ow;
    for (int i = 0; i < oh; ++i) {
      const float* top = in + int64_t{i} * kh * in_w;
      if (kh == 2 && kw == 2) {
        // The reference CNN's windows, written out so that the compiler vectorizes them (as
        // selects: with real data a branch would mispredict half the time).
        const float* r0 = top;
        const float* r1 = top + in_w;
#pragma omp simd simdlen(8)  // not the 32 of the bytes: rows are short
        for (int j = 0; j < ow; ++j) {
          float best = r0[2 * j];
          int index = 0;
          const float v1 = r0[2 * j + 1], v2 = r1[2 * j], v3 = r1[2 * j + 1];
          const bool t1 = MaxPoolTakes(v1, best);
          index = t1 ? 1 : index;
          best = t1 ? v1 : best;
          const bool t2 = MaxPoolTakes(v2, best);
          index = t2 ? 2 : index;
          best = t2 ? v2 : best;
          const bool t3 = MaxPoolTakes(v3, best);
          index = t3 ? 3 : index;
          best = t3 ? v3 : best;
          out[i * ow + j] = best;
          win[i * ow + j] = WinnerByte(best, index, relu);
        }
        continue;
      }
      for (int j = 0; j < ow; ++j) {
        float best = top[j * kw];
        int index = 0;
        for (int a = 0; a < kh; ++a) {
          for (int b = 0; b < kw; ++b) {
            const float v = top[a * in_w + j * kw + b];
            if (MaxPoolTakes(v, best)) {
              best = v;
              index = a * kw + b;
            }
          }
        }
        out[i * ow + j] = best;
        win[i * ow + j] = WinnerByte(best, index, relu);
      }
    }
  }
}

}  // namespace

void MaxPoolPlainForward(const Pool2dGeometry& g, const float* x, bool relu, float* y,
                         uint8_t* winners, int threads) {
  const int64_t in_hw = int64_t{g.in_h} * g.in_w, out_hw = int64_t{g.out_h()} * g.out_w();
  const int64_t planes = int64_t{g.batch} * g.channels;
#pragma omp parallel for num_threads(threads) if (planes * in_hw > kParallelMin)
  for (int64_t p = 0; p < planes; ++p) {
    MaxPoolPlainForwardPlanes(g, x + p * in_hw, relu, y + p * out_hw, winners + p * out_hw, 1);
  }
}

namespace {

void MaxPoolPlainBackwardPlanes(const Pool2dGeometry& g, const uint8_t* winners, const float* dy,
                                float* dx, int64_t planes) {
  const int oh = g.out_h(), ow = g.out_w(), kh = g.kernel_h, kw = g.kernel_w;
  const int64_t in_h = g.in_h, in_w = g.in_w;
  const int64_t covered_w = int64_t{ow} * kw, covered_h = int64_t{oh} * kh;
  for (int64_t p = 0; p < planes; ++p) {
    const uint8_t* __restrict win = winners + p * oh * ow;
    const float* __restrict d = dy + p * oh * ow;
    float* __restrict out = dx + p * in_h * in_w;
    for (int i = 0; i < oh; ++i) {
      for (int a = 0; a < kh; ++a) {
        float* __restrict row = out + (int64_t{i} * kh + a) * in_w;
        const uint8_t* w = win + i * ow;
        const float* di = d + i * ow;
        if (kw == 2) {  // the reference CNN's windows, written out for the vectorizer
#pragma omp simd simdlen(8)
          for (int j = 0; j < ow; ++j) {
            const int k = w[j] - 2 * a;  // the winner's column in this row, if in it
            const float grad = WinnerGrad(di[j]);
            row[2 * j] = k == 0 ? grad : 0.0f;
            row[2 * j + 1] = k == 1 ? grad : 0.0f;
          }
        } else {
          for (int j = 0; j < ow; ++j) {
            const int k = w[j] - a * kw;
            const float grad = WinnerGrad(di[j]);
            for (int b = 0; b < kw; ++b) row[j * kw + b] = k == b ? grad : 0.0f;
          }
        }
        if (covered_w < in_w) std::memset(row + covered_w, 0, sizeof(float) * (in_w - covered_w));
      }
    }
    if (covered_h < in_h) {
      std::memset(out + covered_h * in_w, 0, sizeof(float) * (in_h - covered_h) * in_w);
    }
  }
}

}  // namespace

void MaxPoolPlainBackward(const Pool2dGeometry& g, const uint8_t* winners, const float* dy,
                          float* dx, int threads) {
  const int64_t in_hw = int64_t{g.in_h} * g.in_w, out_hw = int64_t{g.out_h()} * g.out_w();
  const int64_t planes = int64_t{g.batch} * g.channels;
#pragma omp parallel for num_threads(threads) if (planes * in_hw > kParallelMin)
  for (int64_t p = 0; p < planes; ++p) {
    MaxPoolPlainBackwardPlanes(g, winners + p * out_hw, dy + p * out_hw, dx + p * in_hw, 1);
  }
}

void MaxPoolBlocked16Forward(const Pool2dGeometry& g, const float* x, bool relu, float* y,
                             uint8_t* winners, int threads) {
  const int oh = g.out_h(), ow = g.out_w(), kh = g.kernel_h, kw = g.kernel_w;
  const int64_t in_h = g.in_h, in_w = g.in_w, blocks = g.channels / kBlock;
  // One task per output row of a channel block: its 16 x ow maxima are gathered in `row`, then
  // written to the 16 channels' planes as whole rows.
  const int64_t tasks = int64_t{g.batch} * blocks * oh;
#pragma omp parallel num_threads(threads) if (tasks * kh * in_w * kBlock > kParallelMin)
  {
    std::vector<float> row(static_cast<size_t>(kBlock) * ow);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t nb = t / oh;  // sample * blocks + block
      const int i = static_cast<int>(t % oh);
      const float* in = x + (nb * in_h + int64_t{i} * kh) * in_w * kBlock;
      uint8_t* win = winners + t * ow * kBlock;  // nChw16c: (nb, i) rows of ow x 16 bytes
      for (int j = 0; j < ow; ++j) {
        const float* first = in + int64_t{j} * kw * kBlock;
        float best[kBlock];
        int index[kBlock];
        for (int c = 0; c < kBlock; ++c) {
          best[c] = first[c];
          index[c] = 0;
        }
        for (int a = 0; a < kh; ++a) {
          for (int b = 0; b < kw; ++b) {
            const float* v = first + (a * in_w + b) * kBlock;
            const int k = a * kw + b;
#pragma omp simd
            for (int c = 0; c < kBlock; ++c) {
              const bool wins = MaxPoolTakes(v[c], best[c]);
              best[c] = wins ? v[c] : best[c];
              index[c] = wins ? k : index[c];
            }
          }
        }
#pragma omp simd
        for (int c = 0; c < kBlock; ++c) win[j * kBlock + c] = WinnerByte(best[c], index[c], relu);
        for (int c = 0; c < kBlock; ++c) row[c * ow + j] = best[c];
      }
      // Channel nb's block starts at plane nb * 16 (sample n's planes are n * channels + c).
      float* out = y + (nb * kBlock * oh + i) * ow;
      for (int c = 0; c < kBlock; ++c) {
        std::memcpy(out + int64_t{c} * oh * ow, row.data() + c * ow, sizeof(float) * ow);
      }
    }
  }
}

namespace {

// MaxPoolBlocked16Backward into float32 blocks, or bfloat16 ones: each row made in float32 (in a
// staging row for bfloat16, then rounded whole, which vectorises where a select per bfloat16
// element did not: 7% of a bf16 CNN step against 1%).
template <typename T>
void Blocked16Backward(const Pool2dGeometry& g, const uint8_t* winners, const float* dy, T* dx,
                       int threads) {
  const int oh = g.out_h(), ow = g.out_w(), kh = g.kernel_h, kw = g.kernel_w;
  const int64_t in_h = g.in_h, in_w = g.in_w, blocks = g.channels / kBlock;
  const int64_t covered_w = int64_t{ow} * kw;  // columns inside some window; the rest get zeros
  const int64_t tasks = int64_t{g.batch} * blocks * oh;
#pragma omp parallel num_threads(threads) if (tasks * kh * in_w * kBlock > kParallelMin)
  {
    constexpr bool kFloat = std::is_same_v<T, float>;
    std::vector<float> grads(static_cast<size_t>(kBlock) * ow);  // this row's dy, [j][c]
    std::vector<float> staging(kFloat ? 0 : in_w * kBlock);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t nb = t / oh;
      const int i = static_cast<int>(t % oh);
      const float* d = dy + (nb * kBlock * oh + i) * ow;
      for (int c = 0; c < kBlock; ++c) {
        for (int j = 0; j < ow; ++j)
          grads[j * kBlock + c] = WinnerGrad(d[int64_t{c} * oh * ow + j]);
      }
      const uint8_t* win = winners + t * ow * kBlock;
      T* out = dx + (nb * in_h + int64_t{i} * kh) * in_w * kBlock;
      for (int a = 0; a < kh; ++a) {
        T* row = out + a * in_w * kBlock;
        float* frow = kFloat ? reinterpret_cast<float*>(row) : staging.data();
        for (int j = 0; j < ow; ++j) {
          const uint8_t* w = win + j * kBlock;
          const float* gj = grads.data() + j * kBlock;
          for (int b = 0; b < kw; ++b) {
            float* o = frow + (int64_t{j} * kw + b) * kBlock;
            const int k = a * kw + b;
#pragma omp simd
            for (int c = 0; c < kBlock; ++c) o[c] = w[c] == k ? gj[c] : 0.0f;
          }
        }
        std::memset(frow + covered_w * kBlock, 0, sizeof(float) * (in_w - covered_w) * kBlock);
        if constexpr (!kFloat) RoundRowToBf16(in_w * kBlock, frow, row);
      }
      if (i == oh - 1) {  // the rows below the last window row
        const int64_t covered_h = int64_t{oh} * kh;
        std::memset(dx + (nb * in_h + covered_h) * in_w * kBlock, 0,
                    sizeof(T) * (in_h - covered_h) * in_w * kBlock);
      }
    }
  }
}

}  // namespace

void MaxPoolBlocked16Backward(const Pool2dGeometry& g, const uint8_t* winners, const float* dy,
                              float* dx, int threads) {
  Blocked16Backward(g, winners, dy, dx, threads);
}

void MaxPoolBlocked16Backward(const Pool2dGeometry& g, const uint8_t* winners, const float* dy,
                              uint16_t* dx, int threads) {
  Blocked16Backward(g, winners, dy, dx, threads);
}

}  // namespace kiln::cpu_internal
