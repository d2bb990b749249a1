// The new activations and pooling against PyTorch's definitions, on every backend: activations
// against their formulas in double (torch.tanh, torch.sigmoid, F.gelu with approximate='none',
// F.leaky_relu, F.silu, and their autograd derivatives), pooling against worked examples whose
// values PyTorch's MaxPool2d / AvgPool2d (count_include_pad=True) / AdaptiveAvgPool2d give, and
// against a direct average pooling in double.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend_registry.h"
#include "engine/layers/avgpool2d.h"
#include "engine/model/model.h"
#include "tests/engine/test_util.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

using testing::MakeTensor;
using testing::RandomValues;
using testing::ToHost;

class LayerReference : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string absent = testing::AbsentDeviceReason(GetParam());
    if (!absent.empty()) GTEST_SKIP() << absent;
    auto b = CreateBackend(GetParam(), {2});
    ASSERT_OK(b) << b.status();
    backend_ = std::move(*b);
  }
  Tensor Zeros(const Shape& shape) {
    auto t = backend_->Allocate(DType::kF32, shape);
    EXPECT_OK(t);
    return t.ok() ? *t : Tensor();
  }
  std::unique_ptr<Backend> backend_;
};

// Within a few float32 ulps of the double value (each device's libm may differ by a few).
void ExpectNear(const std::vector<float>& got, const std::vector<double>& want,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    if (!(std::abs(got[i] - want[i]) <= 1e-6 * std::max(1.0, std::abs(want[i])))) {
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", want " << want[i];
      ++bad;
    }
  }
}

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

struct Definition {
  ActivationKind kind;
  const char* name;
  double (*forward)(double x, double slope);
  double (*derivative)(double x, double slope);
};

const Definition kDefinitions[] = {
    {ActivationKind::kTanh, "tanh", [](double x, double) { return std::tanh(x); },
     [](double x, double) { return 1.0 - std::tanh(x) * std::tanh(x); }},
    {ActivationKind::kSigmoid, "sigmoid", [](double x, double) { return Sigmoid(x); },
     [](double x, double) { return Sigmoid(x) * (1.0 - Sigmoid(x)); }},
    {ActivationKind::kGelu, "gelu",
     [](double x, double) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); },
     [](double x, double) {
       return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) +
              x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
     }},
    {ActivationKind::kLeakyRelu, "leaky_relu",
     [](double x, double slope) { return x > 0 ? x : slope * x; },
     [](double x, double slope) { return x > 0 ? 1.0 : slope; }},
    {ActivationKind::kSilu, "silu", [](double x, double) { return x * Sigmoid(x); },
     [](double x, double) { return Sigmoid(x) * (1.0 + x * (1.0 - Sigmoid(x))); }},
};

TEST_P(LayerReference, ActivationsMatchTheirDefinitionsInDouble) {
  std::vector<float> x = RandomValues(1000, 31, -8, 8);
  for (float v : {0.0f, -0.0f, 1.0f, -1.0f, 30.0f, -30.0f, 100.0f, -100.0f, 1e-6f, -1e-6f}) {
    x.push_back(v);
  }
  const std::vector<float> dy = RandomValues(x.size(), 32);
  const int64_t n = static_cast<int64_t>(x.size());
  const float slope = 0.2f;
  for (const Definition& d : kDefinitions) {
    SCOPED_TRACE(d.name);
    Tensor xt = MakeTensor(*backend_, {n}, x), dyt = MakeTensor(*backend_, {n}, dy);
    Tensor y = Zeros({n}), dx = Zeros({n});
    ASSERT_OK(backend_->ActivationForward(d.kind, slope, n, xt.f32(), y.f32()));
    ASSERT_OK(
        backend_->ActivationBackward(d.kind, slope, n, xt.f32(), y.f32(), dyt.f32(), dx.f32()));
    std::vector<double> want_y(n), want_dx(n);
    for (int64_t i = 0; i < n; ++i) {
      want_y[i] = d.forward(x[i], slope);
      want_dx[i] = dy[i] * d.derivative(x[i], slope);
    }
    ExpectNear(ToHost(*backend_, y), want_y, "forward");
    // In place (y = x, dx = dy), as Backend allows: the same values.
    Tensor in_place = MakeTensor(*backend_, {n}, x);
    ASSERT_OK(backend_->ActivationForward(d.kind, slope, n, in_place.f32(), in_place.f32()));
    EXPECT_EQ(ToHost(*backend_, in_place), ToHost(*backend_, y)) << "forward in place";
    Tensor grad = MakeTensor(*backend_, {n}, dy);
    ASSERT_OK(
        backend_->ActivationBackward(d.kind, slope, n, xt.f32(), y.f32(), grad.f32(), grad.f32()));
    EXPECT_EQ(ToHost(*backend_, grad), ToHost(*backend_, dx)) << "backward in place";
    // The backward reads the float32 forward output (tanh, sigmoid) or input: a few ulps of
    // that on top.
    const std::vector<float> got_dx = ToHost(*backend_, dx);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(got_dx[i], want_dx[i], 2e-6 * std::max(1.0, std::abs(want_dx[i])))
          << "backward at x = " << x[i];
    }
  }
}

TEST_P(LayerReference, ActivationsAtPointsPyTorchPrints) {
  // torch.nn.functional at x = 1 and -1 (printed with 7 digits).
  const std::vector<float> x = {1.0f, -1.0f};
  struct Known {
    ActivationKind kind;
    float slope, at_one, at_minus_one;
  };
  for (Known k : {Known{ActivationKind::kTanh, 0, 0.7615942f, -0.7615942f},
                  Known{ActivationKind::kSigmoid, 0, 0.7310586f, 0.2689414f},
                  Known{ActivationKind::kGelu, 0, 0.8413447f, -0.1586553f},
                  Known{ActivationKind::kLeakyRelu, 0.01f, 1.0f, -0.01f},
                  Known{ActivationKind::kSilu, 0, 0.7310586f, -0.2689414f}}) {
    SCOPED_TRACE(static_cast<int>(k.kind));
    Tensor xt = MakeTensor(*backend_, {2}, x), y = Zeros({2});
    ASSERT_OK(backend_->ActivationForward(k.kind, k.slope, 2, xt.f32(), y.f32()));
    const std::vector<float> got = ToHost(*backend_, y);
    EXPECT_NEAR(got[0], k.at_one, 3e-7);
    EXPECT_NEAR(got[1], k.at_minus_one, 3e-7);
  }
}

Pool2dGeometry Pool(int batch, int channels, int h, int w, int kernel, int stride, int pad) {
  Pool2dGeometry g;
  g.batch = batch;
  g.channels = channels;
  g.in_h = h;
  g.in_w = w;
  g.kernel_h = g.kernel_w = kernel;
  g.stride_h = g.stride_w = stride;
  g.padding_h = g.padding_w = pad;
  return g;
}

TEST_P(LayerReference, MaxPoolNeverPicksPadding) {
  // nn.MaxPool2d(2, 2, padding=1) of -[[1,2,3],[4,5,6],[7,8,9]]: a zero of padding would win
  // every border window.
  const Pool2dGeometry g = Pool(1, 1, 3, 3, 2, 2, 1);
  Tensor x = MakeTensor(*backend_, {1, 1, 3, 3}, {-1, -2, -3, -4, -5, -6, -7, -8, -9});
  Tensor y = Zeros({1, 1, 2, 2});
  auto argmax = backend_->Allocate(DType::kI32, {1, 1, 2, 2});
  ASSERT_OK(argmax);
  ASSERT_OK(backend_->MaxPool2dForward(g, x.f32(), y.f32(), argmax->i32()));
  EXPECT_EQ(ToHost(*backend_, y), (std::vector<float>{-1, -2, -4, -5}));
  Tensor dy = MakeTensor(*backend_, {1, 1, 2, 2}, {1, 2, 3, 4}), dx = Zeros({1, 1, 3, 3});
  ASSERT_OK(backend_->MaxPool2dBackward(g, dy.f32(), argmax->i32(), dx.f32()));
  EXPECT_EQ(ToHost(*backend_, dx), (std::vector<float>{1, 2, 0, 3, 4, 0, 0, 0, 0}));
}

TEST_P(LayerReference, AvgPoolCountsPaddingInTheDivisor) {
  // nn.AvgPool2d(2, 2, padding=1) of [[1,2,3],[4,5,6],[7,8,9]]: every window divides by 4.
  const Pool2dGeometry g = Pool(1, 1, 3, 3, 2, 2, 1);
  Tensor x = MakeTensor(*backend_, {1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  Tensor y = Zeros({1, 1, 2, 2});
  ASSERT_OK(backend_->AvgPool2dForward(g, x.f32(), y.f32()));
  EXPECT_EQ(ToHost(*backend_, y), (std::vector<float>{0.25f, 1.25f, 2.75f, 7.0f}));
  Tensor dy = MakeTensor(*backend_, {1, 1, 2, 2}, {1, 2, 3, 4}), dx = Zeros({1, 1, 3, 3});
  ASSERT_OK(backend_->AvgPool2dBackward(g, dy.f32(), dx.f32()));
  EXPECT_EQ(ToHost(*backend_, dx),
            (std::vector<float>{0.25f, 0.5f, 0.5f, 0.75f, 1, 1, 0.75f, 1, 1}));
}

TEST_P(LayerReference, AvgPoolMatchesADirectPoolingInDouble) {
  for (const Pool2dGeometry& g : {Pool(2, 3, 7, 9, 3, 2, 1), Pool(1, 2, 8, 8, 3, 1, 1),
                                  Pool(3, 1, 5, 6, 2, 1, 0), Pool(2, 2, 9, 9, 5, 3, 2)}) {
    SCOPED_TRACE(::testing::Message() << g.in_h << "x" << g.in_w << " k" << g.kernel_h << " s"
                                      << g.stride_h << " p" << g.padding_h);
    const int planes = g.batch * g.channels, oh = g.out_h(), ow = g.out_w();
    const std::vector<float> x = RandomValues(size_t{1} * planes * g.in_h * g.in_w, 33);
    const std::vector<float> dy = RandomValues(size_t{1} * planes * oh * ow, 34);
    std::vector<double> want_y(dy.size(), 0.0), want_dx(x.size(), 0.0);
    for (int p = 0; p < planes; ++p) {
      for (int i = 0; i < oh; ++i) {
        for (int j = 0; j < ow; ++j) {
          const size_t o = (size_t{1} * p * oh + i) * ow + j;
          for (int a = 0; a < g.kernel_h; ++a) {
            for (int b = 0; b < g.kernel_w; ++b) {
              const int r = i * g.stride_h - g.padding_h + a, c = j * g.stride_w - g.padding_w + b;
              if (r < 0 || r >= g.in_h || c < 0 || c >= g.in_w) continue;  // a zero of padding
              const size_t q = (size_t{1} * p * g.in_h + r) * g.in_w + c;
              want_y[o] += x[q] / double(g.kernel_h * g.kernel_w);
              want_dx[q] += dy[o] / double(g.kernel_h * g.kernel_w);
            }
          }
        }
      }
    }
    Tensor xt = MakeTensor(*backend_, {planes * g.in_h * g.in_w}, x);
    Tensor dyt = MakeTensor(*backend_, {planes * oh * ow}, dy);
    Tensor y = Zeros({planes * oh * ow}), dx = Zeros({planes * g.in_h * g.in_w});
    ASSERT_OK(backend_->AvgPool2dForward(g, xt.f32(), y.f32()));
    ASSERT_OK(backend_->AvgPool2dBackward(g, dyt.f32(), dx.f32()));
    const std::vector<float> got_y = ToHost(*backend_, y), got_dx = ToHost(*backend_, dx);
    for (size_t i = 0; i < got_y.size(); ++i) ASSERT_NEAR(got_y[i], want_y[i], 1e-6) << i;
    for (size_t i = 0; i < got_dx.size(); ++i) ASSERT_NEAR(got_dx[i], want_dx[i], 1e-6) << i;
  }
}

TEST_P(LayerReference, AdaptiveAvgPoolToOneIsThePlaneMean) {
  auto shapes = InferShapes({{3, 4, 5}, {AdaptiveAvgPool2dConfig{}}});
  ASSERT_OK(shapes);
  LayerContext ctx;
  ctx.backend = backend_.get();
  ctx.input = (*shapes)[0];
  ctx.output = (*shapes)[1];
  auto layer = MakeLayer(AdaptiveAvgPool2dConfig{}, ctx);
  ASSERT_OK(layer);
  const std::vector<float> x = RandomValues(2 * 3 * 20, 35);
  Tensor xt = MakeTensor(*backend_, {2, 3, 4, 5}, x), y = Zeros({2, 3, 1, 1});
  ASSERT_OK((*layer)->Forward(xt, &y, Mode::kEval));
  const std::vector<float> got = ToHost(*backend_, y);
  for (int p = 0; p < 6; ++p) {
    double mean = 0;
    for (int i = 0; i < 20; ++i) mean += x[p * 20 + i] / 20.0;
    EXPECT_NEAR(got[p], mean, 1e-6) << "plane " << p;
  }
}

INSTANTIATE_TEST_SUITE_P(EveryBackend, LayerReference,
                         ::testing::Values(std::string("cpu"), std::string("cuda:0")),
                         testing::DeviceParamName);

}  // namespace
}  // namespace kiln
