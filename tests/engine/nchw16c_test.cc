// Images kept in nChw16c (ImageLayout::kNchw16c) between the CPU backend's convolutions: each op
// over that layout against the same op over NCHW (convolutions and average pooling the same
// bits, batch normalisation within rounding of its sums), the errors for what no backend runs,
// and the model's choice of layouts (a residual block kept blocked, its results those of the
// separate NCHW layers). CUDA keeps NCHW and refuses the layout (skipped without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/backend_registry.h"
#include "engine/model/model.h"
#include "tests/engine/test_util.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

using testing::MakeTensor;
using testing::RandomValues;
using testing::ToHost;

// The test's own conversions: plain[(n, c, p)] <-> blocked[(n, c / 16, p, c % 16)].
std::vector<float> ToBlocked(const std::vector<float>& plain, int batch, int channels, int64_t hw) {
  std::vector<float> out(plain.size());
  for (int n = 0; n < batch; ++n) {
    for (int c = 0; c < channels; ++c) {
      for (int64_t p = 0; p < hw; ++p) {
        out[((int64_t{n} * (channels / 16) + c / 16) * hw + p) * 16 + c % 16] =
            plain[(int64_t{n} * channels + c) * hw + p];
      }
    }
  }
  return out;
}
std::vector<float> ToPlain(const std::vector<float>& blocked, int batch, int channels, int64_t hw) {
  std::vector<float> out(blocked.size());
  for (int n = 0; n < batch; ++n) {
    for (int c = 0; c < channels; ++c) {
      for (int64_t p = 0; p < hw; ++p) {
        out[(int64_t{n} * channels + c) * hw + p] =
            blocked[((int64_t{n} * (channels / 16) + c / 16) * hw + p) * 16 + c % 16];
      }
    }
  }
  return out;
}

void ExpectWithin(const std::vector<float>& got, const std::vector<float>& want, double rel,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], rel * std::max(1.0, std::abs(double{want[i]})))
        << what << " at " << i;
  }
}

BatchNorm2dConfig BatchNorm(int64_t features) {
  BatchNorm2dConfig c;
  c.num_features = features;
  return c;
}

std::unique_ptr<Backend> Cpu(int threads = 2) {
  auto b = CreateBackend("cpu", {threads});
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

// Every combination of layouts gives the bits NCHW gives: the same oneDNN primitive runs, only
// the reorders around it differ. Strided, padded and 1x1 geometries, with and without a bias
// and a fused ReLU, and one input channel (whose backward is im2col, run on NCHW copies).
TEST(Nchw16c, ConvolutionsGiveTheSameBitsInEveryLayout) {
  auto backend = Cpu();
  ASSERT_NE(backend, nullptr);
  Backend& b = *backend;
  struct Case {
    int batch, in_c, hw, out_c, k, stride, pad;
  };
  for (const Case& c : {Case{3, 16, 9, 32, 3, 2, 1}, Case{2, 32, 8, 16, 1, 1, 0},
                        Case{2, 16, 6, 16, 3, 1, 1}, Case{2, 1, 7, 16, 3, 1, 1}}) {
    Conv2dGeometry g;
    g.batch = c.batch;
    g.in_channels = c.in_c;
    g.in_h = g.in_w = c.hw;
    g.out_channels = c.out_c;
    g.kernel_h = g.kernel_w = c.k;
    g.stride_h = g.stride_w = c.stride;
    g.padding_h = g.padding_w = c.pad;
    const int64_t in_hw = int64_t{c.hw} * c.hw, out_hw = int64_t{g.out_h()} * g.out_w();
    const int64_t xn = c.batch * c.in_c * in_hw, yn = c.batch * c.out_c * out_hw;
    const std::vector<float> xv = RandomValues(xn, 1),
                             wv = RandomValues(c.out_c * c.in_c * c.k * c.k, 2),
                             bv = RandomValues(c.out_c, 3), dyv = RandomValues(yn, 4);
    for (Activation act : {Activation::kNone, Activation::kRelu}) {
      std::vector<float> want[4];
      for (ImageLayout xl : {ImageLayout::kNchw, ImageLayout::kNchw16c}) {
        if (xl == ImageLayout::kNchw16c && c.in_c % 16 != 0) continue;
        for (ImageLayout yl : {ImageLayout::kNchw, ImageLayout::kNchw16c}) {
          const std::string what = absl::StrCat("case in ", c.in_c, " out ", c.out_c, " k ", c.k,
                                                " relu ", act == Activation::kRelu, " x ",
                                                ImageLayoutName(xl), " y ", ImageLayoutName(yl));
          Conv2dGeometry lg = g;
          lg.x_layout = xl;
          lg.y_layout = yl;
          auto in = [&](const std::vector<float>& v, ImageLayout l, int ch, int64_t hw) {
            return l == ImageLayout::kNchw16c ? ToBlocked(v, c.batch, ch, hw) : v;
          };
          auto out = [&](const std::vector<float>& v, ImageLayout l, int ch, int64_t hw) {
            return l == ImageLayout::kNchw16c ? ToPlain(v, c.batch, ch, hw) : v;
          };
          Tensor x = MakeTensor(b, {xn}, in(xv, xl, c.in_c, in_hw));
          Tensor w = MakeTensor(b, {int64_t(wv.size())}, wv);
          Tensor bias = MakeTensor(b, {c.out_c}, bv);
          Tensor y = MakeTensor(b, {yn}, std::vector<float>(yn, 0.0f));
          ASSERT_OK(b.Conv2dForward(lg, x.f32(), w.f32(), bias.f32(), act, y.f32())) << what;
          Tensor dy = MakeTensor(b, {yn}, in(dyv, yl, c.out_c, out_hw));
          Tensor dw = MakeTensor(b, {int64_t(wv.size())}, std::vector<float>(wv.size(), 0.0f));
          Tensor db = MakeTensor(b, {c.out_c}, std::vector<float>(c.out_c, 0.0f));
          Tensor dx = MakeTensor(b, {xn}, std::vector<float>(xn, 0.0f));
          ASSERT_OK(b.Conv2dBackward(lg, x.f32(), w.f32(), y.f32(), dy.f32(), act, dw.f32(),
                                     db.f32(), dx.f32()))
              << what;
          const std::vector<float> got[4] = {out(ToHost(b, y), yl, c.out_c, out_hw), ToHost(b, dw),
                                             ToHost(b, db), out(ToHost(b, dx), xl, c.in_c, in_hw)};
          for (int k = 0; k < 4; ++k) {
            if (want[k].empty()) {
              want[k] = got[k];  // NCHW both ways runs first
            } else {
              EXPECT_EQ(got[k], want[k]) << what << " output " << k;
            }
          }
        }
      }
    }
  }
}

// Average pooling sums each window in the same order in either layout: the same bits, both ways;
// a global pooling's output (one pixel) is the same bytes as NCHW.
TEST(Nchw16c, AveragePoolingGivesTheSameBits) {
  auto backend = Cpu();
  ASSERT_NE(backend, nullptr);
  Backend& b = *backend;
  for (const Pool2dGeometry& base : {Pool2dGeometry{3, 32, 8, 8, 8, 8, 8, 8, 0, 0},
                                     Pool2dGeometry{2, 16, 7, 7, 3, 3, 2, 2, 1, 1},
                                     Pool2dGeometry{2, 16, 6, 6, 2, 2, 2, 2, 0, 0}}) {
    const int64_t in_hw = int64_t{base.in_h} * base.in_w,
                  out_hw = int64_t{base.out_h()} * base.out_w();
    const int64_t xn = base.batch * base.channels * in_hw, yn = base.batch * base.channels * out_hw;
    const std::vector<float> xv = RandomValues(xn, 7), dyv = RandomValues(yn, 8);
    std::vector<float> results[2][2];
    for (ImageLayout l : {ImageLayout::kNchw, ImageLayout::kNchw16c}) {
      Pool2dGeometry g = base;
      g.layout = l;
      const bool blocked = l == ImageLayout::kNchw16c;
      Tensor x = MakeTensor(b, {xn}, blocked ? ToBlocked(xv, g.batch, g.channels, in_hw) : xv);
      Tensor y = MakeTensor(b, {yn}, std::vector<float>(yn, 0.0f));
      ASSERT_OK(b.AvgPool2dForward(g, x.f32(), y.f32()));
      Tensor dy = MakeTensor(b, {yn}, blocked ? ToBlocked(dyv, g.batch, g.channels, out_hw) : dyv);
      Tensor dx = MakeTensor(b, {xn}, std::vector<float>(xn, 1.0f));
      ASSERT_OK(b.AvgPool2dBackward(g, dy.f32(), dx.f32()));
      results[blocked][0] =
          blocked ? ToPlain(ToHost(b, y), g.batch, g.channels, out_hw) : ToHost(b, y);
      results[blocked][1] =
          blocked ? ToPlain(ToHost(b, dx), g.batch, g.channels, in_hw) : ToHost(b, dx);
    }
    EXPECT_EQ(results[1][0], results[0][0]) << base.kernel_h;
    EXPECT_EQ(results[1][1], results[0][1]) << base.kernel_h;
  }
}

// Batch normalisation's three passes over nChw16c against NCHW: the per-channel sums are in
// double in another order (within 1e-6 relative); the statistics written for the backward and
// the running ones likewise. Bits do not depend on the thread count.
TEST(Nchw16c, BatchNormMatchesNchwAndRepeatsOnAnyThreadCount) {
  // The last: values far from zero against their spread (mean 1000, spread 1), where statistics
  // from sums of squares could lose digits that the NCHW loops' two passes keep: the statistics
  // and gradients are held to the same bound. Its outputs y (x * scale + shift in float, with
  // shift near -3,500, whose float spacing is 2.4e-4) move by that spacing when the scale moves
  // by one bit, in either layout: held to 1e-3.
  struct Case {
    BatchNormGeometry g;
    float lo, hi;
    double y_tolerance = 1e-5;
  };
  for (const Case& test_case :
       {Case{BatchNormGeometry{8, 16, 9 * 9}, -2, 3}, Case{BatchNormGeometry{3, 64, 4}, -2, 3},
        Case{BatchNormGeometry{2, 32, 7 * 5}, -2, 3},
        Case{BatchNormGeometry{4, 16, 8 * 8}, 999.5f, 1000.5f, 1e-3}}) {
    const BatchNormGeometry& base = test_case.g;
    const int c = base.channels;
    const int64_t n = int64_t{base.batch} * c * base.spatial;
    const std::vector<float> xv = RandomValues(n, 11, test_case.lo, test_case.hi),
                             dyv = RandomValues(n, 12);
    const std::vector<float> gamma = RandomValues(c, 13, 0.5f, 1.5f), beta = RandomValues(c, 14);
    // [layout or thread count][output]: y, saved mean, saved invstd, running mean, running var,
    // dgamma, dbeta, dx, inference y.
    const char* names[] = {"y",      "saved mean", "saved invstd", "running mean", "running var",
                           "dgamma", "dbeta",      "dx",           "inference y"};
    std::vector<std::vector<std::vector<float>>> runs;
    for (int run = 0; run < 3; ++run) {
      const bool blocked = run > 0;
      auto backend = Cpu(run == 2 ? 1 : 2);
      ASSERT_NE(backend, nullptr);
      Backend& b = *backend;
      BatchNormGeometry g = base;
      g.layout = blocked ? ImageLayout::kNchw16c : ImageLayout::kNchw;
      auto in = [&](const std::vector<float>& v) {
        return blocked ? ToBlocked(v, g.batch, c, g.spatial) : v;
      };
      auto out = [&](const std::vector<float>& v) {
        return blocked ? ToPlain(v, g.batch, c, g.spatial) : v;
      };
      Tensor x = MakeTensor(b, {n}, in(xv)), dy = MakeTensor(b, {n}, in(dyv));
      Tensor gm = MakeTensor(b, {c}, gamma), bt = MakeTensor(b, {c}, beta);
      Tensor y = MakeTensor(b, {n}, std::vector<float>(n)),
             dx = MakeTensor(b, {n}, std::vector<float>(n));
      Tensor rm = MakeTensor(b, {c}, std::vector<float>(c, 0.1f));
      Tensor rv = MakeTensor(b, {c}, std::vector<float>(c, 0.9f));
      Tensor sm = MakeTensor(b, {c}, std::vector<float>(c)),
             si = MakeTensor(b, {c}, std::vector<float>(c));
      Tensor dg = MakeTensor(b, {c}, std::vector<float>(c, 0.5f));
      Tensor dbt = MakeTensor(b, {c}, std::vector<float>(c, 0.5f));
      Tensor yi = MakeTensor(b, {n}, std::vector<float>(n));
      ASSERT_OK(b.BatchNormForwardTraining(g, 1e-5, 0.1, x.f32(), gm.f32(), bt.f32(), y.f32(),
                                           rm.f32(), rv.f32(), sm.f32(), si.f32()));
      ASSERT_OK(b.BatchNormBackward(g, 1e-5, x.f32(), gm.f32(), sm.f32(), si.f32(), dy.f32(),
                                    dg.f32(), dbt.f32(), dx.f32()));
      ASSERT_OK(b.BatchNormForwardInference(g, 1e-5, x.f32(), gm.f32(), bt.f32(), rm.f32(),
                                            rv.f32(), yi.f32()));
      runs.push_back({out(ToHost(b, y)), ToHost(b, sm), ToHost(b, si), ToHost(b, rm), ToHost(b, rv),
                      ToHost(b, dg), ToHost(b, dbt), out(ToHost(b, dx)), out(ToHost(b, yi))});
    }
    for (size_t k = 0; k < runs[0].size(); ++k) {
      const bool is_y = k == 0 || k == 8;
      ExpectWithin(runs[1][k], runs[0][k], is_y ? test_case.y_tolerance : 1e-5,
                   std::string("nChw16c against NCHW: ") + names[k]);
    }
    EXPECT_EQ(runs[2], runs[1]) << "nChw16c on 1 thread against 2";
  }
}

// Batch norm with the ReLU fused gives the bits of the two ops one after the other, in both
// layouts (nChw16c in one pass; NCHW as the two ops), in training, evaluation and backward.
TEST(Nchw16c, BatchNormWithReluGivesTheBitsOfTheTwoOps) {
  auto backend = Cpu();
  ASSERT_NE(backend, nullptr);
  Backend& b = *backend;
  ASSERT_TRUE(b.FusesBatchNormRelu());
  for (ImageLayout layout : {ImageLayout::kNchw16c, ImageLayout::kNchw}) {
    BatchNormGeometry g{4, 32, 6 * 5};
    g.layout = layout;
    const int c = g.channels;
    const int64_t n = int64_t{g.batch} * c * g.spatial;
    const std::vector<float> xv = RandomValues(n, 21, -2, 3), dyv = RandomValues(n, 22);
    const std::vector<float> gamma = RandomValues(c, 23, 0.5f, 1.5f), beta = RandomValues(c, 24);
    std::vector<float> results[2];
    for (int fused = 0; fused < 2; ++fused) {
      Tensor x = MakeTensor(b, {n}, xv), dy = MakeTensor(b, {n}, dyv);
      Tensor gm = MakeTensor(b, {c}, gamma), bt = MakeTensor(b, {c}, beta);
      Tensor y = MakeTensor(b, {n}, std::vector<float>(n)),
             dx = MakeTensor(b, {n}, std::vector<float>(n));
      Tensor masked = MakeTensor(b, {n}, std::vector<float>(n));
      Tensor rm = MakeTensor(b, {c}, std::vector<float>(c, 0.1f)),
             rv = MakeTensor(b, {c}, std::vector<float>(c, 0.9f));
      Tensor sm = MakeTensor(b, {c}, std::vector<float>(c)),
             si = MakeTensor(b, {c}, std::vector<float>(c));
      Tensor dg = MakeTensor(b, {c}, std::vector<float>(c)),
             dbt = MakeTensor(b, {c}, std::vector<float>(c));
      Tensor yi = MakeTensor(b, {n}, std::vector<float>(n));
      if (fused == 1) {
        ASSERT_OK(b.BatchNormReluForwardTraining(g, 1e-5, 0.1, x.f32(), gm.f32(), bt.f32(), y.f32(),
                                                 rm.f32(), rv.f32(), sm.f32(), si.f32()));
        ASSERT_OK(b.BatchNormReluBackward(g, 1e-5, x.f32(), gm.f32(), sm.f32(), si.f32(), y.f32(),
                                          dy.f32(), dg.f32(), dbt.f32(), dx.f32()));
        ASSERT_OK(b.BatchNormReluForwardInference(g, 1e-5, x.f32(), gm.f32(), bt.f32(), rm.f32(),
                                                  rv.f32(), yi.f32()));
      } else {
        ASSERT_OK(b.BatchNormForwardTraining(g, 1e-5, 0.1, x.f32(), gm.f32(), bt.f32(), y.f32(),
                                             rm.f32(), rv.f32(), sm.f32(), si.f32()));
        ASSERT_OK(b.ReluForward(n, y.f32(), y.f32()));
        ASSERT_OK(b.ReluBackward(n, y.f32(), dy.f32(), masked.f32()));
        ASSERT_OK(b.BatchNormBackward(g, 1e-5, x.f32(), gm.f32(), sm.f32(), si.f32(), masked.f32(),
                                      dg.f32(), dbt.f32(), dx.f32()));
        ASSERT_OK(b.BatchNormForwardInference(g, 1e-5, x.f32(), gm.f32(), bt.f32(), rm.f32(),
                                              rv.f32(), yi.f32()));
        ASSERT_OK(b.ReluForward(n, yi.f32(), yi.f32()));
      }
      for (const Tensor* t : {&y, &dx, &dg, &dbt, &rm, &rv, &yi}) {
        const std::vector<float> v = ToHost(b, *t);
        results[fused].insert(results[fused].end(), v.begin(), v.end());
      }
    }
    EXPECT_EQ(results[1], results[0]) << ImageLayoutName(layout);
  }
}

// What no backend runs is refused, naming the op and the problem; nothing is written.
TEST(Nchw16c, RefusesChannelsThatAreNotBlocksOf16AndMaxPooling) {
  auto backend = Cpu();
  ASSERT_NE(backend, nullptr);
  EXPECT_TRUE(backend->TakesNchw16c());
  BatchNormGeometry bn{2, 8, 4};
  bn.layout = ImageLayout::kNchw16c;
  std::vector<float> v(64, 1.0f), s(8, 1.0f);
  absl::Status st = backend->BatchNormForwardInference(bn, 1e-5, v.data(), s.data(), s.data(),
                                                       s.data(), s.data(), v.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("batchnorm: images in nChw16c need a multiple of 16 channels, got 8"),
            std::string::npos)
      << st;
  EXPECT_EQ(v, std::vector<float>(64, 1.0f));
  Pool2dGeometry pool{1, 16, 4, 4};
  pool.layout = ImageLayout::kNchw16c;
  std::vector<float> x(256), y(64);
  std::vector<int32_t> argmax(64);
  st = backend->MaxPool2dForward(pool, x.data(), y.data(), argmax.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("maxpool2d: takes images in NCHW only"), std::string::npos) << st;
  Conv2dGeometry conv{1, 3, 4, 4, 16, 3, 3};
  conv.x_layout = ImageLayout::kNchw16c;
  std::vector<float> w(16 * 27), out(16 * 4);
  st = backend->Conv2dForward(conv, x.data(), w.data(), nullptr, Activation::kNone, out.data());
  EXPECT_NE(
      st.message().find("conv2d input: images in nChw16c need a multiple of 16 channels, got 3"),
      std::string::npos)
      << st;
}

// CUDA takes NCHW only: it refuses nChw16c by name, and a model on it keeps every value NCHW.
TEST(Nchw16c, CudaRefusesItAndItsModelsKeepNchw) {
  const std::string absent = testing::AbsentDeviceReason("cuda:0");
  if (!absent.empty()) GTEST_SKIP() << absent;
  auto backend = CreateBackend("cuda:0", {2});
  ASSERT_OK(backend);
  EXPECT_FALSE((*backend)->TakesNchw16c());
  EXPECT_FALSE((*backend)->FusesBatchNormRelu());
  BatchNormGeometry bn{2, 16, 4};
  bn.layout = ImageLayout::kNchw16c;
  Tensor v = MakeTensor(**backend, {128}, std::vector<float>(128, 1.0f));
  Tensor s = MakeTensor(**backend, {16}, std::vector<float>(16, 1.0f));
  absl::Status st = (*backend)->BatchNormForwardInference(bn, 1e-5, v.f32(), s.f32(), s.f32(),
                                                          s.f32(), s.f32(), v.f32());
  EXPECT_NE(st.message().find("takes images in NCHW, not nChw16c"), std::string::npos) << st;
  const ModelConfig c{{16, 6, 6},
                      {Conv2dConfig{16, 16, 3, 1, 1}, BatchNorm(16), ReluConfig{},
                       Conv2dConfig{16, 16, 3, 1, 1}, FlattenConfig{}, LinearConfig{576, 3}}};
  auto m = Model::Build(c, backend->get(), 1);
  ASSERT_OK(m);
  for (size_t i = 0; i < (*m)->num_layers(); ++i) {
    EXPECT_EQ((*m)->output_layout(i), ImageLayout::kNchw) << i;
  }
}

}  // namespace
}  // namespace kiln
