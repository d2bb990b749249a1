// What Precision::kBf16 changes on the CPU backend: the float-to-bfloat16 rounding, and GEMMs and
// convolutions that read their inputs rounded to bfloat16 and accumulate in float32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/cpu/bf16.h"
#include "engine/cpu/cpu_backend.h"
#include "tests/engine/test_util.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

// Floats across many magnitudes and both signs, subnormals, zeros and specials among them.
std::vector<float> RandomValuesForBf16() {
  std::vector<float> v = {0.0f, -0.0f, 1e-40f, -3e-39f, 65504.0f, 3.4e38f};
  uint32_t state = 12345;
  for (int i = 0; i < 100000; ++i) {
    state = state * 1664525u + 1013904223u;
    float f;
    std::memcpy(&f, &state, sizeof(f));
    v.push_back(f);  // every bit pattern: NaNs and infinities included
  }
  return v;
}

// bfloat16 by round to nearest even, as torch converts: ties go to the even neighbour, NaNs stay
// NaNs (a signalling one is not carried into infinity), infinities and overflow to infinity as
// IEEE rounding gives, subnormals rounded like any value.
TEST(CpuBf16, RoundsToNearestEvenAndKeepsNanAndInfinity) {
  auto bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return cpu_internal::FloatToBf16(f);
  };
  EXPECT_EQ(bits(0x3f800000u), 0x3f80);  // 1
  EXPECT_EQ(bits(0x3f808000u), 0x3f80);  // 1 + 2^-8, a tie: to the even 1
  EXPECT_EQ(bits(0x3f818000u), 0x3f82);  // a tie above an odd mantissa: up
  EXPECT_EQ(bits(0x3f808001u), 0x3f81);  // past the tie: up
  EXPECT_EQ(bits(0x3f807fffu), 0x3f80);  // short of it: down
  EXPECT_EQ(bits(0xbf808001u), 0xbf81);  // the sign is kept
  EXPECT_EQ(bits(0x7f800000u), 0x7f80);  // +inf
  EXPECT_EQ(bits(0xff800000u), 0xff80);  // -inf
  EXPECT_EQ(bits(0x7f7fffffu), 0x7f80);  // the largest float rounds to infinity
  EXPECT_EQ(bits(0x00018000u), 0x0002);  // a subnormal tie: to even
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xffc00001u, 0x7fffffffu}) {
    const float back = cpu_internal::Bf16ToFloat(bits(nan));
    EXPECT_TRUE(std::isnan(back)) << std::hex << nan;
  }
  EXPECT_EQ(cpu_internal::Bf16ToFloat(0x3f81), 1.0078125f);
  std::vector<float> many = RandomValuesForBf16();
  std::vector<uint16_t> out(many.size());
  cpu_internal::RoundToBf16(static_cast<int64_t>(many.size()), many.data(), out.data());
  for (size_t i = 0; i < many.size(); ++i) {
    ASSERT_EQ(out[i], cpu_internal::FloatToBf16(many[i])) << i;
  }
}

// The bulk conversions round as FloatToBf16 does at every length and start (vector bodies,
// tails, the one-thread and the team paths), the vector instructions' path where the CPU has one
// (AVX512_BF16's, which flushes subnormals, so they are taken aside) and the portable one.
TEST(CpuBf16, BulkRoundingMatchesTheScalarRuleAtEveryLengthAndStart) {
  const std::vector<float> many = RandomValuesForBf16();
  std::vector<uint16_t> out(many.size());
  using Round = void (*)(int64_t, const float*, uint16_t*);
  for (const auto& [name, round] :
       {std::pair<const char*, Round>{"RoundToBf16", cpu_internal::RoundToBf16},
        {"RoundRowToBf16", cpu_internal::RoundRowToBf16},
        {"RoundRowToBf16Portable", cpu_internal::RoundRowToBf16Portable}}) {
    for (const int64_t n : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{33},
                            int64_t{1000}, int64_t{65536}, int64_t{65537}, int64_t{99999}}) {
      for (const int64_t start : {int64_t{0}, int64_t{1}, int64_t{7}}) {
        std::fill(out.begin(), out.end(), 0xdead);
        round(n, many.data() + start, out.data());
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(out[i], cpu_internal::FloatToBf16(many[start + i]))
              << name << " n " << n << " start " << start << " at " << i;
        }
        ASSERT_EQ(out[n], 0xdead) << name << " wrote past n " << n;
      }
    }
  }
}

std::vector<float> RoundedToBf16(const std::vector<float>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    r[i] = cpu_internal::Bf16ToFloat(cpu_internal::FloatToBf16(v[i]));
  }
  return r;
}

// The largest |got - want| over the largest |want|.
double RelativeGap(const std::vector<float>& got, const std::vector<float>& want) {
  double gap = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    gap = std::max(gap, std::abs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  }
  return gap / std::max(scale, 1e-30);
}

// A bf16 backend's GEMMs (plain, transposed, one row, batched) equal the exact product of the
// bfloat16-rounded inputs up to float32 accumulation, and are not the float32 product: the
// rounding of the inputs is all that bf16 changes.
TEST(CpuBf16, GemmsMultiplyTheRoundedInputsAndAccumulateInFloat32) {
  CpuBackend bf16(2, Precision::kBf16), fp32(2, Precision::kFp32);
  struct Case {
    int m, n, k;
    bool ta, tb;
  };
  for (const Case& c : {Case{64, 48, 300, false, false}, Case{33, 17, 129, true, false},
                        Case{20, 31, 64, false, true}, Case{1, 50, 200, false, true}}) {
    SCOPED_TRACE(::testing::Message()
                 << c.m << "x" << c.n << "x" << c.k << " ta " << c.ta << " tb " << c.tb);
    const std::vector<float> a = testing::RandomValues(int64_t{c.m} * c.k, 81, -2, 2);
    const std::vector<float> b = testing::RandomValues(int64_t{c.k} * c.n, 82, -2, 2);
    const std::vector<float> ra = RoundedToBf16(a), rb = RoundedToBf16(b);
    std::vector<float> got(int64_t{c.m} * c.n), plain(got.size());
    const Transpose ta = c.ta ? Transpose::kYes : Transpose::kNo;
    const Transpose tb = c.tb ? Transpose::kYes : Transpose::kNo;
    ASSERT_OK(bf16.Gemm(ta, tb, c.m, c.n, c.k, 1.0f, a.data(), b.data(), 0.0f, got.data()));
    ASSERT_OK(fp32.Gemm(ta, tb, c.m, c.n, c.k, 1.0f, a.data(), b.data(), 0.0f, plain.data()));
    double worst = 0, moved = 0;
    for (int i = 0; i < c.m; ++i) {
      for (int j = 0; j < c.n; ++j) {
        double exact = 0, magnitude = 0;
        for (int p = 0; p < c.k; ++p) {
          const double x = ra[c.ta ? int64_t{p} * c.m + i : int64_t{i} * c.k + p];
          const double y = rb[c.tb ? int64_t{j} * c.k + p : int64_t{p} * c.n + j];
          exact += x * y;
          magnitude += std::abs(x * y);
        }
        const int64_t q = int64_t{i} * c.n + j;
        // float32 accumulation of k products: within k ulps of their magnitudes' sum.
        worst = std::max(worst, std::abs(got[q] - exact) / (magnitude * c.k * 0x1p-24));
        moved = std::max(moved, std::abs(plain[q] - static_cast<double>(got[q])));
      }
    }
    EXPECT_LE(worst, 1.0) << "error over float32 accumulation's bound";
    EXPECT_GT(moved, 1e-3) << "the bf16 product equals the float32 one: inputs not rounded";
  }
  // The attention's batched products take the same rule.
  const int m = 16, n = 16, k = 32, batch = 3;
  const std::vector<float> a = testing::RandomValues(batch * m * k, 83, -2, 2);
  const std::vector<float> b = testing::RandomValues(batch * k * n, 84, -2, 2);
  std::vector<float> got(batch * m * n), one(m * n);
  ASSERT_OK(bf16.GemmStridedBatched(Transpose::kNo, Transpose::kNo, m, n, k, 1.0f, a.data(), m * k,
                                    b.data(), k * n, 0.0f, got.data(), m * n, batch));
  ASSERT_OK(bf16.Gemm(Transpose::kNo, Transpose::kNo, m, n, k, 1.0f, a.data() + 2 * m * k,
                      b.data() + 2 * k * n, 0.0f, one.data()));
  for (int q = 0; q < m * n; ++q) {
    EXPECT_NEAR(got[2 * m * n + q], one[q], 1e-5f * std::max(1.0f, std::abs(one[q]))) << q;
  }
}

// A bf16 convolution's forward and both backward passes are the float32 ones on the
// bfloat16-rounded x, w and dy (up to float32 accumulation order), and not the float32 ones on
// the inputs as they are. The ReLU's mask and the bias stay float32.
TEST(CpuBf16, ConvolutionsReadTheRoundedInputsAndAccumulateInFloat32) {
  CpuBackend bf16(2, Precision::kBf16), fp32(2, Precision::kFp32);
  Conv2dGeometry g;  // the reference CNN's second convolution, on 8 samples
  g.batch = 8;
  g.in_channels = 32;
  g.in_h = g.in_w = 13;
  g.out_channels = 64;
  g.kernel_h = g.kernel_w = 3;
  const int64_t x_elems = int64_t{g.batch} * g.in_channels * g.in_h * g.in_w;
  const int64_t w_elems = int64_t{g.out_channels} * g.in_channels * g.kernel_h * g.kernel_w;
  const int64_t y_elems = int64_t{g.batch} * g.out_channels * g.out_h() * g.out_w();
  const std::vector<float> x = testing::RandomValues(x_elems, 91, -1, 1);
  const std::vector<float> w = testing::RandomValues(w_elems, 92, -0.2f, 0.2f);
  const std::vector<float> bias = testing::RandomValues(g.out_channels, 93, -0.5f, 0.5f);
  const std::vector<float> dy = testing::RandomValues(y_elems, 94, -1, 1);
  const std::vector<float> rx = RoundedToBf16(x), rw = RoundedToBf16(w), rdy = RoundedToBf16(dy);
  struct Pass {
    std::vector<float> y, dw, dbias, dx;
  };
  auto run = [&](CpuBackend& backend, const std::vector<float>& xs, const std::vector<float>& ws,
                 const std::vector<float>& dys) {
    Pass p{std::vector<float>(y_elems), std::vector<float>(w_elems),
           std::vector<float>(g.out_channels), std::vector<float>(x_elems)};
    EXPECT_OK(
        backend.Conv2dForward(g, xs.data(), ws.data(), bias.data(), Activation::kRelu, p.y.data()));
    EXPECT_OK(backend.Conv2dBackward(g, xs.data(), ws.data(), p.y.data(), dys.data(),
                                     Activation::kRelu, p.dw.data(), p.dbias.data(), p.dx.data()));
    return p;
  };
  const Pass got = run(bf16, x, w, dy), want = run(fp32, rx, rw, rdy), plain = run(fp32, x, w, dy);
  // Float32 sums of 288 (forward, dx: 32 x 3 x 3) to 968 (dw: 8 x 11 x 11) products in another
  // order: within ~1e-6 of the largest value; 1e-5 leaves room.
  EXPECT_LE(RelativeGap(got.y, want.y), 1e-5);
  EXPECT_LE(RelativeGap(got.dw, want.dw), 1e-5);
  EXPECT_LE(RelativeGap(got.dbias, want.dbias), 1e-5);
  EXPECT_LE(RelativeGap(got.dx, want.dx), 1e-5);
  // Rounding to 8 mantissa bits moves each input by up to 2^-9 of itself: the sums move by far
  // more than accumulation order does.
  EXPECT_GT(RelativeGap(got.y, plain.y), 1e-4) << "the forward read float32 inputs";
  EXPECT_GT(RelativeGap(got.dw, plain.dw), 1e-4) << "the weight gradient read float32 inputs";
  EXPECT_GT(RelativeGap(got.dx, plain.dx), 1e-4) << "the input gradient read float32 inputs";
}

}  // namespace
}  // namespace kiln
