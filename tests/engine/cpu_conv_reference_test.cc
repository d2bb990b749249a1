// The CPU backend's convolutions at the reference CNN's shapes, where oneDNN takes its blocked
// AVX-512 kernels (channels in blocks of 16; the gradient checks' few channels take others),
// against a direct convolution in double; and run to run bit for bit on two threads, as resuming
// a job needs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/dnnl_conv_plan.h"
#include "engine/cpu/im2col_conv.h"
#include "tests/engine/test_util.h"

namespace kiln {
namespace {

using testing::MakeTensor;
using testing::RandomValues;
using testing::ToHost;

struct ConvCase {
  std::string name;
  Conv2dGeometry g;
};

Conv2dGeometry Geometry(int batch, int c, int hw, int oc, int k, int stride, int pad) {
  Conv2dGeometry g;
  g.batch = batch;
  g.in_channels = c;
  g.in_h = g.in_w = hw;
  g.out_channels = oc;
  g.kernel_h = g.kernel_w = k;
  g.stride_h = g.stride_w = stride;
  g.padding_h = g.padding_w = pad;
  return g;
}

// The gradients of one forward-backward, in double, from the definition.
struct Direct {
  std::vector<double> y, dw, db, dx;
};

Direct DirectConv(const Conv2dGeometry& g, const std::vector<float>& x, const std::vector<float>& w,
                  const std::vector<float>& b, const std::vector<float>& dy) {
  const int oh = g.out_h(), ow = g.out_w();
  Direct d;
  d.y.assign(size_t{1} * g.batch * g.out_channels * oh * ow, 0.0);
  d.dw.assign(w.size(), 0.0);
  d.db.assign(b.size(), 0.0);
  d.dx.assign(x.size(), 0.0);
  auto xi = [&](int n, int c, int i, int j) {
    return ((size_t{1} * n * g.in_channels + c) * g.in_h + i) * g.in_w + j;
  };
  auto wi = [&](int o, int c, int a, int e) {
    return ((size_t{1} * o * g.in_channels + c) * g.kernel_h + a) * g.kernel_w + e;
  };
  for (int pass = 0; pass < 2; ++pass) {
    for (int n = 0; n < g.batch; ++n) {
      for (int o = 0; o < g.out_channels; ++o) {
        for (int i = 0; i < oh; ++i) {
          for (int j = 0; j < ow; ++j) {
            const size_t yi = ((size_t{1} * n * g.out_channels + o) * oh + i) * ow + j;
            // The backward of the fused ReLU: the gradient passes where the output is positive.
            const double grad = pass == 1 && d.y[yi] > 0 ? dy[yi] : 0.0;
            double sum = b[o];
            if (pass == 1) d.db[o] += grad;
            for (int c = 0; c < g.in_channels; ++c) {
              for (int a = 0; a < g.kernel_h; ++a) {
                const int r = i * g.stride_h - g.padding_h + a;
                if (r < 0 || r >= g.in_h) continue;
                for (int e = 0; e < g.kernel_w; ++e) {
                  const int s = j * g.stride_w - g.padding_w + e;
                  if (s < 0 || s >= g.in_w) continue;
                  if (pass == 0) {
                    sum += double{x[xi(n, c, r, s)]} * w[wi(o, c, a, e)];
                  } else {
                    d.dw[wi(o, c, a, e)] += grad * x[xi(n, c, r, s)];
                    d.dx[xi(n, c, r, s)] += grad * w[wi(o, c, a, e)];
                  }
                }
              }
            }
            if (pass == 0) d.y[yi] = sum > 0 ? sum : 0.0;
          }
        }
      }
    }
  }
  return d;
}

void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, double tol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    if (std::abs(got[i] - want[i]) > tol * (1.0 + std::abs(want[i]))) {
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", want " << want[i];
      ++bad;
    }
  }
}

class CpuConvReference : public ::testing::TestWithParam<ConvCase> {};

TEST_P(CpuConvReference, MatchesADirectConvolutionAndRepeatsBitForBit) {
  const Conv2dGeometry g = GetParam().g;
  const std::vector<float> x =
      RandomValues(size_t{1} * g.batch * g.in_channels * g.in_h * g.in_w, 1);
  const std::vector<float> w = RandomValues(
      size_t{1} * g.out_channels * g.in_channels * g.kernel_h * g.kernel_w, 2, -0.2f, 0.2f);
  const std::vector<float> b = RandomValues(g.out_channels, 3, -0.1f, 0.1f);
  const std::vector<float> dy =
      RandomValues(size_t{1} * g.batch * g.out_channels * g.out_h() * g.out_w(), 4);
  const Direct want = DirectConv(g, x, w, b, dy);

  std::vector<std::vector<float>> first;
  for (int run = 0; run < 2; ++run) {
    CpuBackend backend(2);  // a fresh backend: new primitives, same thread count
    const Tensor xt = MakeTensor(backend, {g.batch, g.in_channels, g.in_h, g.in_w}, x);
    const Tensor wt =
        MakeTensor(backend, {g.out_channels, g.in_channels, g.kernel_h, g.kernel_w}, w);
    const Tensor bt = MakeTensor(backend, {g.out_channels}, b);
    const Tensor dyt = MakeTensor(backend, {g.batch, g.out_channels, g.out_h(), g.out_w()}, dy);
    auto y = backend.Allocate(DType::kF32, dyt.shape());
    auto dw = backend.Allocate(DType::kF32, wt.shape());
    auto db = backend.Allocate(DType::kF32, bt.shape());
    auto dx = backend.Allocate(DType::kF32, xt.shape());
    for (auto* t : {&y, &dw, &db, &dx}) ASSERT_OK(*t);
    ASSERT_OK(backend.Conv2dForward(g, xt.f32(), wt.f32(), bt.f32(), Activation::kRelu, y->f32()));
    // Twice: the weight and bias gradients accumulate.
    for (int i = 0; i < 2; ++i) {
      ASSERT_OK(backend.Conv2dBackward(g, xt.f32(), wt.f32(), y->f32(), dyt.f32(),
                                       Activation::kRelu, dw->f32(), db->f32(), dx->f32()));
    }
    std::vector<std::vector<float>> got = {ToHost(backend, *y), ToHost(backend, *dw),
                                           ToHost(backend, *db), ToHost(backend, *dx)};
    if (run == 0) {
      ExpectClose(got[0], want.y, 1e-4, "y");
      std::vector<double> dw2 = want.dw, db2 = want.db;
      for (double& v : dw2) v *= 2;
      for (double& v : db2) v *= 2;
      ExpectClose(got[1], dw2, 1e-4, "dw");
      ExpectClose(got[2], db2, 1e-4, "db");
      ExpectClose(got[3], want.dx, 1e-4, "dx");
      first = std::move(got);
    } else {
      EXPECT_EQ(got, first) << "a second run on the same thread count differs";
    }
  }
}

// Per-axis stride and padding with a rectangular kernel, without a bias, through the backend
// (oneDNN, or im2col for one input channel's backward) ...
Conv2dGeometry PerAxis(int batch, int c, int h, int w, int oc, int kh, int kw, int sh, int sw,
                       int ph, int pw) {
  Conv2dGeometry g;
  g.batch = batch;
  g.in_channels = c;
  g.in_h = h;
  g.in_w = w;
  g.out_channels = oc;
  g.kernel_h = kh;
  g.kernel_w = kw;
  g.stride_h = sh;
  g.stride_w = sw;
  g.padding_h = ph;
  g.padding_w = pw;
  return g;
}

class CpuConvPerAxis : public ::testing::TestWithParam<ConvCase> {};

TEST_P(CpuConvPerAxis, WithoutABiasMatchesADirectConvolutionOnOneDnnAndOnIm2col) {
  const Conv2dGeometry g = GetParam().g;
  const std::vector<float> x =
      RandomValues(size_t{1} * g.batch * g.in_channels * g.in_h * g.in_w, 5);
  const std::vector<float> w = RandomValues(
      size_t{1} * g.out_channels * g.in_channels * g.kernel_h * g.kernel_w, 6, -0.3f, 0.3f);
  const std::vector<float> zero_bias(g.out_channels, 0.0f);
  const std::vector<float> dy =
      RandomValues(size_t{1} * g.batch * g.out_channels * g.out_h() * g.out_w(), 7);
  const Direct want = DirectConv(g, x, w, zero_bias, dy);

  // The backend's own path.
  CpuBackend backend(2);
  const Tensor xt = MakeTensor(backend, {g.batch, g.in_channels, g.in_h, g.in_w}, x);
  const Tensor wt = MakeTensor(backend, {g.out_channels, g.in_channels, g.kernel_h, g.kernel_w}, w);
  const Tensor dyt = MakeTensor(backend, {g.batch, g.out_channels, g.out_h(), g.out_w()}, dy);
  auto y = backend.Allocate(DType::kF32, dyt.shape());
  auto dw = backend.Allocate(DType::kF32, wt.shape());
  auto dx = backend.Allocate(DType::kF32, xt.shape());
  for (auto* t : {&y, &dw, &dx}) ASSERT_OK(*t);
  ASSERT_OK(backend.Conv2dForward(g, xt.f32(), wt.f32(), nullptr, Activation::kRelu, y->f32()));
  ASSERT_OK(backend.Conv2dBackward(g, xt.f32(), wt.f32(), y->f32(), dyt.f32(), Activation::kRelu,
                                   dw->f32(), nullptr, dx->f32()));
  ExpectClose(ToHost(backend, *y), want.y, 1e-4, "backend y");
  ExpectClose(ToHost(backend, *dw), want.dw, 1e-4, "backend dw");
  ExpectClose(ToHost(backend, *dx), want.dx, 1e-4, "backend dx");

  // ... and the im2col fallback itself (what oneDNN's reference-kernel geometries run), on one
  // and on two threads.
  for (int threads : {1, 2}) {
    SCOPED_TRACE(threads);
    const auto fwd = cpu_internal::Im2colScratchFloats(g, threads, /*backward=*/false);
    const auto bwd = cpu_internal::Im2colScratchFloats(g, threads, /*backward=*/true);
    std::vector<float> scratch(std::max(fwd.columns + fwd.partials, bwd.columns + bwd.partials));
    std::vector<float> yi(dy.size(), -7.0f), dwi(w.size(), 0.0f), dxi(x.size(), -7.0f);
    cpu_internal::Im2colConv2dForward(g, x.data(), w.data(), nullptr, Activation::kRelu, yi.data(),
                                      threads, scratch.data());
    cpu_internal::Im2colConv2dBackward(g, x.data(), w.data(), yi.data(), dy.data(),
                                       Activation::kRelu, dwi.data(), nullptr, dxi.data(), threads,
                                       scratch.data());
    ExpectClose(yi, want.y, 1e-4, "im2col y");
    ExpectClose(dwi, want.dw, 1e-4, "im2col dw");
    ExpectClose(dxi, want.dx, 1e-4, "im2col dx");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CpuConvPerAxis,
    ::testing::Values(ConvCase{"Kernel1x7", PerAxis(2, 3, 9, 11, 4, 1, 7, 1, 1, 0, 3)},
                      ConvCase{"Kernel7x1OneChannel", PerAxis(2, 1, 11, 9, 4, 7, 1, 1, 1, 3, 0)},
                      ConvCase{"Stride2x1", PerAxis(3, 4, 10, 12, 5, 3, 5, 2, 1, 1, 2)},
                      ConvCase{"Stride1x2OneChannel", PerAxis(2, 1, 9, 8, 3, 2, 3, 1, 2, 0, 1)},
                      ConvCase{"Stride3x2", PerAxis(2, 17, 13, 11, 16, 4, 3, 3, 2, 2, 1)}),
    [](const ::testing::TestParamInfo<ConvCase>& info) { return info.param.name; });

INSTANTIATE_TEST_SUITE_P(
    ReferenceShapes, CpuConvReference,
    ::testing::Values(ConvCase{"Conv1", Geometry(8, 1, 28, 32, 3, 1, 0)},
                      ConvCase{"Conv2", Geometry(8, 32, 13, 64, 3, 1, 0)},
                      ConvCase{"StridedPadded", Geometry(4, 16, 9, 32, 3, 2, 1)},
                      ConvCase{"OddChannels", Geometry(3, 3, 7, 5, 2, 1, 1)},
                      // The ResNet example's 3x3 stride-1 convolutions: Winograd on every pass
                      // at 64 channels, forward and data gradient at 32, none at 16.
                      ConvCase{"ResNet64", Geometry(4, 64, 8, 64, 3, 1, 1)},
                      ConvCase{"ResNet32", Geometry(4, 32, 12, 32, 3, 1, 1)},
                      ConvCase{"ResNet16", Geometry(4, 16, 16, 16, 3, 1, 1)}),
    [](const ::testing::TestParamInfo<ConvCase>& info) { return info.param.name; });

// Which passes run Winograd's kernel: where it was measured faster than the direct kernel (3x3,
// stride 1, 32 and more channels; the weight gradient from 64), never in bf16 (oneDNN has no
// bfloat16 Winograd: the direct bf16 kernel is the faster there) nor for other kernels.
TEST(CpuConvWinograd, RunsWhereItWasMeasuredFaster) {
  struct Want {
    const char* name;
    Conv2dGeometry g;
    bool bf16, forward, data, weights;
  };
  const Want cases[] = {
      {"64 channels", Geometry(4, 64, 8, 64, 3, 1, 1), false, true, true, true},
      {"32 to 64 channels", Geometry(4, 32, 16, 64, 3, 1, 1), false, true, true, false},
      {"32 channels unpadded", Geometry(8, 32, 13, 32, 3, 1, 0), false, true, true, false},
      {"16 channels", Geometry(4, 16, 16, 16, 3, 1, 1), false, false, false, false},
      {"stride 2", Geometry(4, 32, 16, 64, 3, 2, 1), false, false, false, false},
      {"1x1", Geometry(4, 64, 8, 64, 1, 1, 0), false, false, false, false},
      {"bf16", Geometry(4, 64, 8, 64, 3, 1, 1), true, false, false, false},
  };
  CpuBackend backend(2);  // oneDNN's engine and thread count, as the backend sets them
  for (const Want& c : cases) {
    SCOPED_TRACE(c.name);
    auto forward = cpu_internal::ConvForwardPlan::Create(c.g, /*bias=*/false, Activation::kNone,
                                                         c.bf16);
    auto backward = cpu_internal::ConvBackwardPlan::Create(c.g, /*bias=*/false, Activation::kNone,
                                                           c.bf16);
    ASSERT_OK(forward);
    ASSERT_OK(backward);
    EXPECT_EQ((*forward)->winograd(), c.forward);
    EXPECT_EQ((*backward)->winograd_data(), c.data);
    EXPECT_EQ((*backward)->winograd_weights(), c.weights);
  }
}

}  // namespace
}  // namespace kiln
