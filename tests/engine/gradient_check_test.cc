// Numeric gradient checks (central differences) of every layer and loss against Backward, one
// test body run over every backend ("cpu", "cuda:0"); a backend not present on this machine
// skips, saying why.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/backend_registry.h"
#include "engine/layers/layers.h"
#include "engine/layers/activation.h"
#include "engine/layers/avgpool2d.h"
#include "engine/layers/batchnorm.h"
#include "engine/layers/conv2d.h"
#include "engine/layers/dropout.h"
#include "engine/layers/flatten.h"
#include "engine/layers/linear.h"
#include "engine/layers/maxpool2d.h"
#include "engine/layers/relu.h"
#include "engine/layers/softmax.h"
#include "engine/loss.h"
#include "engine/model/model.h"
#include "engine/model/model_graph.h"
#include "tests/engine/test_util.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

using testing::DistinctValues;
using testing::MakeTensor;
using testing::RandomValues;
using testing::ToHost;

constexpr float kEps = 1e-2f;
constexpr double kTolerance = 2e-2;  // relative, float32 central differences

double RelativeError(double analytic, double numeric) {
  return std::abs(analytic - numeric) / std::max({1e-3, std::abs(analytic), std::abs(numeric)});
}

// The devices every gradient check runs on.
std::vector<std::string> Devices() { return {"cpu", "cuda:0"}; }

// A model's forward on the host in double, from its config and its parameters by state-dict name:
// the reference of CheckModel. Knows the layers that test uses (linear, conv2d, relu, flatten,
// add, concat).
class HostModel {
 public:
  explicit HostModel(const ModelConfig& config) : config_(config) {
    auto g = ResolveGraph(config);
    EXPECT_OK(g) << g.status();
    if (g.ok()) graph_ = *g;
    auto shapes = InferShapes(config);
    EXPECT_OK(shapes) << shapes.status();
    if (shapes.ok()) shapes_ = *shapes;
  }

  // L = sum over the batch of output . r.
  double Loss(const std::vector<float>& x, int batch, const std::vector<float>& r) const {
    const int64_t in = NumElements(shapes_[0]), out = NumElements(shapes_.back());
    double loss = 0;
    for (int n = 0; n < batch; ++n) {
      std::vector<std::vector<double>> values(shapes_.size());
      values[0].assign(x.begin() + n * in, x.begin() + (n + 1) * in);
      for (size_t i = 0; i < config_.layers.size(); ++i) values[i + 1] = Node(i, values);
      for (int64_t k = 0; k < out; ++k) loss += values.back()[k] * r[n * out + k];
    }
    return loss;
  }

  std::map<std::string, std::vector<double>> params;

 private:
  const std::vector<double>& Param(size_t i, const char* which) const {
    static const std::vector<double> kNone;
    auto it = params.find(StateDictName(graph_.names[i], which));
    return it == params.end() ? kNone : it->second;
  }

  std::vector<double> Node(size_t i, const std::vector<std::vector<double>>& values) const {
    const std::vector<double>& x = values[graph_.inputs[i][0]];
    const Shape& is = shapes_[graph_.inputs[i][0]];
    const Shape& os = shapes_[i + 1];
    std::vector<double> y;
    const LayerConfig& layer = config_.layers[i];
    if (const auto* c = std::get_if<LinearConfig>(&layer)) {
      const std::vector<double>&w = Param(i, "weight"), &bias = Param(i, "bias");
      for (int64_t k = 0; k < c->out_features; ++k) {
        double s = bias.empty() ? 0 : bias[k];
        for (int64_t j = 0; j < c->in_features; ++j) s += w[k * c->in_features + j] * x[j];
        y.push_back(s);
      }
    } else if (const auto* c = std::get_if<Conv2dConfig>(&layer)) {
      const std::vector<double>&w = Param(i, "weight"), &bias = Param(i, "bias");
      const int64_t C = is[0], H = is[1], W = is[2], K = c->kernel_size;
      for (int64_t o = 0; o < os[0]; ++o) {
        for (int64_t oy = 0; oy < os[1]; ++oy) {
          for (int64_t ox = 0; ox < os[2]; ++ox) {
            double s = bias.empty() ? 0 : bias[o];
            for (int64_t ch = 0; ch < C; ++ch) {
              for (int64_t ky = 0; ky < K; ++ky) {
                for (int64_t kx = 0; kx < K; ++kx) {
                  const int64_t iy = oy * c->stride + ky - c->padding;
                  const int64_t ix = ox * c->stride + kx - c->padding;
                  if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                  s += w[((o * C + ch) * K + ky) * K + kx] * x[(ch * H + iy) * W + ix];
                }
              }
            }
            y.push_back(s);
          }
        }
      }
    } else if (std::holds_alternative<ReluConfig>(layer)) {
      for (double v : x) y.push_back(v > 0 ? v : 0);
    } else if (std::holds_alternative<FlattenConfig>(layer)) {
      y = x;
    } else if (std::holds_alternative<AddConfig>(layer)) {
      y.assign(x.size(), 0.0);
      for (int v : graph_.inputs[i]) {
        for (size_t k = 0; k < y.size(); ++k) y[k] += values[v][k];
      }
    } else if (std::holds_alternative<ConcatConfig>(layer)) {
      for (int v : graph_.inputs[i]) y.insert(y.end(), values[v].begin(), values[v].end());
    } else {
      ADD_FAILURE() << "HostModel has no " << LayerTypeName(layer);
    }
    EXPECT_EQ(static_cast<int64_t>(y.size()), NumElements(os)) << graph_.names[i];
    return y;
  }

  const ModelConfig& config_;
  ModelGraph graph_;
  std::vector<Shape> shapes_;
};

// A gradient check on one backend; the derived fixtures' parameters say which.
class GradientCheckBase : public ::testing::Test {
 protected:
  void UseBackend(const std::string& device) {
    const std::string absent = testing::AbsentDeviceReason(device);
    if (!absent.empty()) GTEST_SKIP() << absent;
    auto b = CreateBackend(device, {2});
    ASSERT_OK(b) << b.status();
    backend_ = std::move(*b);
  }

  // L = sum(y * r) for a fixed random r, so dL/dy = r. Checks dL/dx and dL/dparams.
  void CheckLayer(Layer& layer, int batch, std::vector<float> x_values) {
    Backend& b = *backend_;
    Shape xs = layer.input_shape(), ys = layer.output_shape();
    xs.insert(xs.begin(), batch);
    ys.insert(ys.begin(), batch);
    Tensor x = MakeTensor(b, xs, x_values);
    auto y = b.Allocate(DType::kF32, ys);
    ASSERT_OK(y);
    const std::vector<float> r = RandomValues(y->numel(), 99);
    Tensor dy = MakeTensor(b, ys, r);
    auto dx = b.Allocate(DType::kF32, xs);
    ASSERT_OK(dx);

    auto loss = [&]() {
      EXPECT_OK(layer.Forward(x, &*y, Mode::kTrain));
      const std::vector<float> yv = ToHost(b, *y);
      double l = 0;
      for (size_t i = 0; i < yv.size(); ++i) l += static_cast<double>(yv[i]) * r[i];
      return l;
    };
    loss();
    for (Parameter* p : layer.parameters()) ASSERT_OK(b.Fill(&p->grad, 0));
    ASSERT_OK(layer.Backward(x, *y, dy, &*dx));
    const std::vector<float> dx_analytic = ToHost(b, *dx);

    auto check = [&](Tensor& t, const std::vector<float>& analytic, const std::string& what) {
      std::vector<float> v = ToHost(b, t);
      for (size_t i = 0; i < v.size(); ++i) {
        const float keep = v[i];
        v[i] = keep + kEps;
        ASSERT_OK(b.CopyFromHost(v.data(), v.size() * 4, &t));
        const double up = loss();
        v[i] = keep - kEps;
        ASSERT_OK(b.CopyFromHost(v.data(), v.size() * 4, &t));
        const double down = loss();
        v[i] = keep;
        ASSERT_OK(b.CopyFromHost(v.data(), v.size() * 4, &t));
        const double numeric = (up - down) / (2 * kEps);
        ASSERT_LT(RelativeError(analytic[i], numeric), kTolerance)
            << layer.type() << " " << what << "[" << i << "]: backward " << analytic[i]
            << " vs numeric " << numeric;
      }
    };
    check(x, dx_analytic, "input");
    for (Parameter* p : layer.parameters()) {
      const std::vector<float> g = ToHost(b, p->grad);
      check(p->value, g, p->name);
    }
  }

  // The layer of `config` over a per-sample `input`, built as the model builds it.
  std::unique_ptr<Layer> Build(const LayerConfig& config, const Shape& input) {
    auto shapes = InferShapes({input, {config}});
    EXPECT_OK(shapes) << shapes.status();
    if (!shapes.ok()) return nullptr;
    LayerContext ctx;
    ctx.backend = backend_.get();
    ctx.input = (*shapes)[0];
    ctx.output = (*shapes)[1];
    ctx.rng = &rng_;
    auto layer = std::visit([&](const auto& c) { return MakeLayer(c, ctx); }, config);
    EXPECT_OK(layer) << layer.status();
    return layer.ok() ? *std::move(layer) : nullptr;
  }

  // A whole model's parameter gradients, through its graph (an output read by several nodes gets
  // the sum of their gradients), against central differences of L = sum(y * r) computed on the
  // host in double (HostLoss): float32 differences through a few ReLUs are too noisy to tell a
  // small error from rounding and crossed kinks. The model's forward must match the host's too.
  void CheckModel(const ModelConfig& config, int batch, Fusion fusion) {
    Backend& b = *backend_;
    auto built = Model::Build(config, &b, 5, fusion);
    ASSERT_OK(built) << built.status();
    Model& model = **built;
    Shape xs = config.input_shape;
    xs.insert(xs.begin(), batch);
    const std::vector<float> xv = RandomValues(NumElements(xs), 21);
    Tensor x = MakeTensor(b, xs, xv);
    Shape ys = model.output_shape();
    ys.insert(ys.begin(), batch);
    const std::vector<float> r = RandomValues(NumElements(ys), 99);
    Tensor dy = MakeTensor(b, ys, r);
    ASSERT_OK(model.ZeroGrad());
    auto y = model.Forward(x, Mode::kTrain);
    ASSERT_OK(y);
    const std::vector<float> yv = ToHost(b, **y);
    ASSERT_OK(model.Backward(dy));

    HostModel host(config);
    for (const NamedParameter& p : model.parameters()) {
      const std::vector<float> v = ToHost(b, p.param->value);
      host.params[p.name].assign(v.begin(), v.end());
    }
    double device_loss = 0;
    for (size_t i = 0; i < yv.size(); ++i) device_loss += static_cast<double>(yv[i]) * r[i];
    const double host_loss = host.Loss(xv, batch, r);
    EXPECT_NEAR(device_loss, host_loss, 1e-4 * std::max(1.0, std::abs(host_loss)));

    constexpr double kStep = 1e-6;
    for (const NamedParameter& p : model.parameters()) {
      const std::vector<float> analytic = ToHost(b, p.param->grad);
      std::vector<double>& v = host.params[p.name];
      for (size_t i = 0; i < v.size(); ++i) {
        const double keep = v[i];
        v[i] = keep + kStep;
        const double up = host.Loss(xv, batch, r);
        v[i] = keep - kStep;
        const double down = host.Loss(xv, batch, r);
        v[i] = keep;
        const double numeric = (up - down) / (2 * kStep);
        ASSERT_LT(RelativeError(analytic[i], numeric), 1e-3)
            << p.name << "[" << i << "]: backward " << analytic[i] << " vs numeric " << numeric;
      }
    }
  }

  std::unique_ptr<Backend> backend_;
  Rng rng_{7};
};

// The parameter: a device name.
class GradientCheck : public GradientCheckBase, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override { UseBackend(GetParam()); }
};

TEST_P(GradientCheck, Linear) {
  auto layer = Linear::Create({5, 3, true}, backend_.get(), {5}, &rng_);
  ASSERT_OK(layer);
  CheckLayer(**layer, 4, RandomValues(20, 1));
}

TEST_P(GradientCheck, LinearWithoutBias) {
  auto layer = Linear::Create({4, 2, false}, backend_.get(), {4}, &rng_);
  ASSERT_OK(layer);
  EXPECT_EQ((*layer)->parameters().size(), 1u);
  CheckLayer(**layer, 3, RandomValues(12, 2));
}

// Every branch of im2col/col2im: plain, padded, strided, non-square, several channels; and the
// per-axis forms (kernel kh x kw, stride sh x sw, padding ph x pw where those are given, >= 0),
// on oneDNN (several channels) and on im2col (one input channel's backward), with and without a
// bias.
struct ConvCase {
  int c, h, w, oc, k, stride, pad;
  int kh = -1, kw = -1, sh = -1, sw = -1, ph = -1, pw = -1;
  bool bias = true;
};
class ConvGradient : public GradientCheckBase,
                     public ::testing::WithParamInterface<std::tuple<std::string, ConvCase>> {
 protected:
  void SetUp() override { UseBackend(std::get<0>(GetParam())); }
};

TEST_P(ConvGradient, MatchesFiniteDifferences) {
  const ConvCase p = std::get<1>(GetParam());
  Conv2dConfig cfg{p.c, p.oc, p.k, p.stride, p.pad, p.bias};
  if (p.kh >= 0) cfg.kernel_h = p.kh;
  if (p.kw >= 0) cfg.kernel_w = p.kw;
  if (p.sh >= 0) cfg.stride_h = p.sh;
  if (p.sw >= 0) cfg.stride_w = p.sw;
  if (p.ph >= 0) cfg.padding_h = p.ph;
  if (p.pw >= 0) cfg.padding_w = p.pw;
  auto shapes = InferShapes({{p.c, p.h, p.w}, {cfg}});
  ASSERT_OK(shapes) << shapes.status();
  auto layer = Conv2d::Create(cfg, backend_.get(), (*shapes)[0], (*shapes)[1], &rng_);
  ASSERT_OK(layer);
  CheckLayer(**layer, 2, RandomValues(2 * p.c * p.h * p.w, 3));
}

// Named by shape and device: "c2_5x4_oc3_k3_s1_p1_cuda_0".
std::string ConvCaseName(const ::testing::TestParamInfo<std::tuple<std::string, ConvCase>>& info) {
  const ConvCase& p = std::get<1>(info.param);
  std::string name = absl::StrCat("c", p.c, "_", p.h, "x", p.w, "_oc", p.oc, "_k", p.k, "_s",
                                  p.stride, "_p", p.pad);
  if (p.kh >= 0 || p.kw >= 0 || p.sh >= 0 || p.sw >= 0 || p.ph >= 0 || p.pw >= 0) {
    absl::StrAppend(&name, "_axes", p.kh, "_", p.kw, "_", p.sh, "_", p.sw, "_", p.ph, "_", p.pw);
  }
  absl::StrReplaceAll({{"-1", "u"}}, &name);
  if (!p.bias) absl::StrAppend(&name, "_nobias");
  return absl::StrCat(name, "_", testing::DeviceTestName(std::get<0>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ConvGradient,
    ::testing::Combine(
        ::testing::ValuesIn(Devices()),
        ::testing::Values(ConvCase{1, 5, 5, 2, 3, 1, 0}, ConvCase{2, 5, 4, 3, 3, 1, 1},
                          ConvCase{2, 7, 6, 2, 3, 2, 0}, ConvCase{3, 6, 6, 2, 2, 2, 1},
                          ConvCase{1, 4, 4, 1, 1, 1, 0}, ConvCase{1, 6, 5, 2, 3, 1, 1},
                          ConvCase{1, 6, 6, 2, 5, 1, 2},
                          ConvCase{2, 5, 4, 3, 3, 1, 1, -1, -1, -1, -1, -1, -1, false},
                          ConvCase{1, 6, 5, 2, 3, 1, 1, -1, -1, -1, -1, -1, -1, false},
                          ConvCase{2, 5, 7, 3, 3, 1, 0, 1, 3, -1, -1, 0, 1},
                          ConvCase{1, 7, 5, 2, 3, 1, 0, 3, 1, -1, -1, 1, 0},
                          ConvCase{2, 7, 8, 2, 3, 1, 1, 3, 2, 2, 1, 1, 0, false},
                          ConvCase{1, 8, 7, 2, 3, 1, 1, 2, 3, 1, 2, 0, 2},
                          ConvCase{3, 6, 9, 2, 3, 1, 0, 2, 4, 2, 3, 1, 2})),
    ConvCaseName);

// One sample takes the backend's other path (no per-sample team; OpenBLAS threads the GEMMs).
TEST_P(GradientCheck, ConvOfOneSample) {
  Conv2dConfig cfg{2, 3, 3, 1, 1, true};
  auto shapes = InferShapes({{2, 5, 4}, {cfg}});
  ASSERT_OK(shapes) << shapes.status();
  auto layer = Conv2d::Create(cfg, backend_.get(), (*shapes)[0], (*shapes)[1], &rng_);
  ASSERT_OK(layer);
  CheckLayer(**layer, 1, RandomValues(2 * 5 * 4, 5));
}

TEST_P(GradientCheck, Relu) {
  Relu layer(backend_.get(), {3, 4});
  CheckLayer(layer, 2, DistinctValues(24, 4));
}

TEST_P(GradientCheck, MaxPool) {
  MaxPool2d layer({2, 0}, backend_.get(), {2, 5, 4}, {2, 2, 2});
  CheckLayer(layer, 2, DistinctValues(80, 5));
}

TEST_P(GradientCheck, MaxPoolOverlappingWindows) {
  MaxPool2d layer({3, 1}, backend_.get(), {1, 5, 5}, {1, 3, 3});
  CheckLayer(layer, 2, DistinctValues(50, 6));
}

TEST_P(GradientCheck, MaxPoolWithPadding) {
  // Padding 1 of a 3x3 window at stride 2: the border windows are clipped, padding never wins
  // (all the values are negative, so a padded zero would).
  std::vector<float> x = DistinctValues(2 * 2 * 5 * 6, 12);
  for (float& v : x) v -= 4.0f;
  auto layer = Build(MaxPool2dConfig{3, 2, 1}, {2, 5, 6});
  ASSERT_NE(layer, nullptr);
  EXPECT_EQ(layer->output_shape(), (Shape{2, 3, 3}));
  CheckLayer(*layer, 2, x);
}

TEST_P(GradientCheck, AvgPool) {
  auto layer = Build(AvgPool2dConfig{2, 0, 0}, {2, 5, 4});
  ASSERT_NE(layer, nullptr);
  CheckLayer(*layer, 2, RandomValues(80, 13));
}

TEST_P(GradientCheck, AvgPoolOverlappingWindowsWithPadding) {
  auto layer = Build(AvgPool2dConfig{3, 2, 1}, {2, 6, 5});
  ASSERT_NE(layer, nullptr);
  EXPECT_EQ(layer->output_shape(), (Shape{2, 3, 3}));
  CheckLayer(*layer, 2, RandomValues(120, 14));
}

TEST_P(GradientCheck, AdaptiveAvgPoolGlobal) {
  auto layer = Build(AdaptiveAvgPool2dConfig{}, {3, 4, 5});
  ASSERT_NE(layer, nullptr);
  EXPECT_EQ(layer->output_shape(), (Shape{3, 1, 1}));
  CheckLayer(*layer, 2, RandomValues(120, 15));
}

TEST_P(GradientCheck, AdaptiveAvgPoolToTwoByThree) {
  auto layer = Build(AdaptiveAvgPool2dConfig{2, 3}, {2, 4, 6});
  ASSERT_NE(layer, nullptr);
  CheckLayer(*layer, 2, RandomValues(96, 16));
}

TEST_P(GradientCheck, Tanh) {
  auto layer = Build(TanhConfig{}, {3, 4});
  ASSERT_NE(layer, nullptr);
  CheckLayer(*layer, 2, RandomValues(24, 17, -3, 3));
}

TEST_P(GradientCheck, Sigmoid) {
  auto layer = Build(SigmoidConfig{}, {3, 4});
  ASSERT_NE(layer, nullptr);
  CheckLayer(*layer, 2, RandomValues(24, 18, -4, 4));
}

TEST_P(GradientCheck, Gelu) {
  auto layer = Build(GeluConfig{}, {3, 4});
  ASSERT_NE(layer, nullptr);
  CheckLayer(*layer, 2, RandomValues(24, 19, -3, 3));
}

TEST_P(GradientCheck, LeakyRelu) {
  // Away from the kink at 0, with PyTorch's default slope and a steeper one.
  for (float slope : {0.01f, 0.2f}) {
    SCOPED_TRACE(slope);
    auto layer = Build(LeakyReluConfig{slope}, {3, 4});
    ASSERT_NE(layer, nullptr);
    CheckLayer(*layer, 2, DistinctValues(24, 20));
  }
}

TEST_P(GradientCheck, Silu) {
  auto layer = Build(SiluConfig{}, {3, 4});
  ASSERT_NE(layer, nullptr);
  CheckLayer(*layer, 2, RandomValues(24, 21, -4, 4));
}

TEST_P(GradientCheck, Flatten) {
  Flatten layer(backend_.get(), {2, 3, 2});
  CheckLayer(layer, 2, RandomValues(24, 7));
}

TEST_P(GradientCheck, Softmax) {
  Softmax layer(backend_.get(), {5});
  CheckLayer(layer, 3, RandomValues(15, 8));
}

TEST_P(GradientCheck, DropoutWithItsMaskFixed) {
  // The mask is drawn from a counter-based stream, so reset it before every forward.
  class FixedDropout : public Layer {
   public:
    FixedDropout(Backend* b) : Layer(b, {10}, {10}), inner_({0.4f}, b, {10}, 42) {}
    const char* type() const override { return "dropout"; }
    absl::Status Forward(const Tensor& x, Tensor* y, Mode m) override {
      inner_.set_offset(0);
      return inner_.Forward(x, y, m);
    }
    absl::Status Backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) override {
      return inner_.Backward(x, y, dy, dx);
    }
    Dropout inner_;
  } layer(backend_.get());
  CheckLayer(layer, 4, RandomValues(40, 9));
}

TEST_P(GradientCheck, DropoutDropsAboutPAndScalesTheRest) {
  Dropout layer({0.25f}, backend_.get(), {1000}, 1);
  Tensor x = MakeTensor(*backend_, {4, 1000}, std::vector<float>(4000, 1.0f));
  auto y = backend_->Allocate(DType::kF32, {4, 1000});
  ASSERT_OK(layer.Forward(x, &*y, Mode::kTrain));
  int zeros = 0;
  for (float v : ToHost(*backend_, *y)) {
    if (v == 0) {
      ++zeros;
    } else {
      EXPECT_FLOAT_EQ(v, 1.0f / 0.75f);
    }
  }
  EXPECT_NEAR(zeros / 4000.0, 0.25, 0.03);
  ASSERT_OK(layer.Forward(x, &*y, Mode::kEval));
  for (float v : ToHost(*backend_, *y)) EXPECT_EQ(v, 1.0f);
}

// Batch normalisation in training mode (batch statistics), with a random scale and shift so that
// every term of the backward formula counts.
std::unique_ptr<Layer> MakeBatchNorm(const char* type, const BatchNormFields& c, const Shape& shape,
                                     Backend* b) {
  auto layer = BatchNorm::Create(type, c, b, shape);
  EXPECT_OK(layer) << layer.status();
  if (!layer.ok()) return nullptr;
  uint32_t seed = 20;
  for (Parameter* p : (*layer)->parameters()) {
    const std::vector<float> v = RandomValues(p->value.numel(), ++seed, 0.5f, 1.5f);
    EXPECT_OK(b->CopyFromHost(v.data(), v.size() * 4, &p->value));
  }
  EXPECT_EQ((*layer)->parameters().size(), c.affine ? 2u : 0u);
  return std::move(*layer);
}

TEST_P(GradientCheck, BatchNorm2d) {
  BatchNormFields c;
  c.num_features = 3;
  auto layer = MakeBatchNorm("batchnorm2d", c, {3, 4, 5}, backend_.get());
  ASSERT_NE(layer, nullptr);
  CheckLayer(*layer, 2, RandomValues(2 * 60, 12, -2, 2));
}

TEST_P(GradientCheck, BatchNorm2dWithoutAffine) {
  BatchNormFields c;
  c.num_features = 2;
  c.affine = false;
  c.eps = 1e-3;
  auto layer = MakeBatchNorm("batchnorm2d", c, {2, 3, 3}, backend_.get());
  ASSERT_NE(layer, nullptr);
  CheckLayer(*layer, 3, RandomValues(3 * 18, 13, -2, 2));
}

TEST_P(GradientCheck, BatchNorm1d) {
  BatchNormFields c;
  c.num_features = 4;
  auto layer = MakeBatchNorm("batchnorm1d", c, {4}, backend_.get());
  ASSERT_NE(layer, nullptr);
  CheckLayer(*layer, 6, RandomValues(6 * 4, 14, -2, 2));
}

TEST_P(GradientCheck, BatchNorm1dOverChannelsAndLength) {
  BatchNormFields c;
  c.num_features = 3;
  auto layer = MakeBatchNorm("batchnorm1d", c, {3, 4}, backend_.get());
  ASSERT_NE(layer, nullptr);
  CheckLayer(*layer, 2, RandomValues(2 * 12, 15, -2, 2));
}

// Losses: d(mean loss)/d(logits) against central differences.
void CheckLoss(Backend& b, LossKind kind, float label_smoothing = 0) {
  const int rows = 4, cols = 5;
  std::vector<float> z = RandomValues(rows * cols, 11, -2, 2);
  Tensor logits = MakeTensor(b, {rows, cols}, z);
  auto labels = b.Allocate(DType::kI32, {rows});
  const std::vector<int32_t> lab = {0, 3, 4, 1};
  ASSERT_OK(b.CopyFromHost(lab.data(), 16, &*labels));
  auto scalar = b.Allocate(DType::kF32, {1});
  auto correct = b.Allocate(DType::kI32, {1});
  auto dz = b.Allocate(DType::kF32, {rows, cols});
  Loss loss(kind, &b, label_smoothing);
  auto value = [&]() {
    EXPECT_OK(loss.Compute(logits, *labels, scalar->f32(), correct->i32(), nullptr));
    return static_cast<double>(ToHost(b, *scalar)[0]);
  };
  ASSERT_OK(loss.Compute(logits, *labels, scalar->f32(), correct->i32(), &*dz));
  const std::vector<float> analytic = ToHost(b, *dz);
  for (int i = 0; i < rows * cols; ++i) {
    const float keep = z[i];
    z[i] = keep + kEps;
    ASSERT_OK(b.CopyFromHost(z.data(), z.size() * 4, &logits));
    const double up = value();
    z[i] = keep - kEps;
    ASSERT_OK(b.CopyFromHost(z.data(), z.size() * 4, &logits));
    const double down = value();
    z[i] = keep;
    ASSERT_OK(b.CopyFromHost(z.data(), z.size() * 4, &logits));
    EXPECT_LT(RelativeError(analytic[i], (up - down) / (2 * kEps)), kTolerance)
        << LossName(kind) << " dlogits[" << i << "]";
  }
}

TEST_P(GradientCheck, CrossEntropy) { CheckLoss(*backend_, LossKind::kCrossEntropy); }
TEST_P(GradientCheck, MeanSquaredError) { CheckLoss(*backend_, LossKind::kMeanSquaredError); }
TEST_P(GradientCheck, CrossEntropyWithLabelSmoothing) {
  CheckLoss(*backend_, LossKind::kCrossEntropy, 0.1f);
  CheckLoss(*backend_, LossKind::kCrossEntropy, 1.0f);
}

TEST_P(GradientCheck, CrossEntropyWithLabelSmoothingIsPyTorchsFormula) {
  // Row [0, ln 3], label 1, e = 0.2: p = [1/4, 3/4]; PyTorch gives
  // (1 - e) * -ln(3/4) + e * (-ln(1/4) - ln(3/4)) / 2.
  Backend& b = *backend_;
  Tensor logits = MakeTensor(b, {1, 2}, {0.0f, std::log(3.0f)});
  auto labels = b.Allocate(DType::kI32, {1});
  const int32_t one = 1;
  ASSERT_OK(b.CopyFromHost(&one, 4, &*labels));
  auto scalar = b.Allocate(DType::kF32, {1});
  auto correct = b.Allocate(DType::kI32, {1});
  auto dz = b.Allocate(DType::kF32, {1, 2});
  Loss loss(LossKind::kCrossEntropy, &b, 0.2f);
  ASSERT_OK(loss.Compute(logits, *labels, scalar->f32(), correct->i32(), &*dz));
  const double e = 0.2;
  EXPECT_NEAR(ToHost(b, *scalar)[0],
              (1 - e) * -std::log(0.75) + e * (-std::log(0.25) - std::log(0.75)) / 2, 1e-6);
  // dz = p - target, target = [e/2, 1 - e + e/2].
  const std::vector<float> grad = ToHost(b, *dz);
  EXPECT_NEAR(grad[0], 0.25 - e / 2, 1e-6);
  EXPECT_NEAR(grad[1], 0.75 - (1 - e + e / 2), 1e-6);
}

TEST_P(GradientCheck, CrossEntropyRejectsLabelSmoothingOutsideZeroToOne) {
  Backend& b = *backend_;
  Tensor logits = MakeTensor(b, {1, 3}, {0, 0, 0});
  auto labels = b.Allocate(DType::kI32, {1});
  auto scalar = b.Allocate(DType::kF32, {1});
  auto correct = b.Allocate(DType::kI32, {1});
  for (float bad : {-0.1f, 1.5f, std::nanf("")}) {
    const absl::Status s = b.SoftmaxCrossEntropy(1, 3, logits.f32(), labels->i32(), bad,
                                                 scalar->f32(), correct->i32(), nullptr);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("label smoothing"), std::string::npos) << s;
  }
}

TEST_P(GradientCheck, CrossEntropyValueAndAccuracyAreExact) {
  // logits row 0 = [0, ln 3] label 1 -> loss ln(4/3); row 1 = [2, 0] label 1 -> ln(1 + e^2).
  Backend& b = *backend_;
  Tensor logits = MakeTensor(b, {2, 2}, {0.0f, std::log(3.0f), 2.0f, 0.0f});
  auto labels = b.Allocate(DType::kI32, {2});
  const std::vector<int32_t> lab = {1, 1};
  ASSERT_OK(b.CopyFromHost(lab.data(), 8, &*labels));
  auto scalar = b.Allocate(DType::kF32, {1});
  auto correct = b.Allocate(DType::kI32, {1});
  Loss loss(LossKind::kCrossEntropy, &b);
  ASSERT_OK(loss.Compute(logits, *labels, scalar->f32(), correct->i32(), nullptr));
  EXPECT_NEAR(ToHost(b, *scalar)[0], (std::log(4.0 / 3.0) + std::log(1 + std::exp(2.0))) / 2, 1e-6);
  int32_t hits = -1;
  ASSERT_OK(b.CopyToHost(*correct, &hits, 4));
  EXPECT_EQ(hits, 1);
}

TEST_P(GradientCheck, CrossEntropyRejectsOutOfRangeLabel) {
  Backend& b = *backend_;
  Tensor logits = MakeTensor(b, {1, 3}, {0, 0, 0});
  auto labels = b.Allocate(DType::kI32, {1});
  const int32_t bad = 7;
  ASSERT_OK(b.CopyFromHost(&bad, 4, &*labels));
  auto scalar = b.Allocate(DType::kF32, {1});
  auto correct = b.Allocate(DType::kI32, {1});
  Loss loss(LossKind::kCrossEntropy, &b);
  auto s = loss.Compute(logits, *labels, scalar->f32(), correct->i32(), nullptr);
  // The CPU says so at once; CUDA checks labels in its kernel and reports it by the next sync.
  if (s.ok()) s = b.Synchronize();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("label 7"), std::string::npos) << s;
}

// A ResNet basic block without BatchNorm on 2x5x5 images: stem conv-relu, conv-relu-conv, plus the
// stem's output itself (identity) or a strided 1x1 conv of it (projection), add, relu, linear.
ModelConfig ResidualBlock(bool projection) {
  ModelConfig c;
  c.input_shape = {2, 5, 5};
  if (!projection) {
    c.layers = {Conv2dConfig{2, 3, 3, 1, 1},
                ReluConfig{},
                Conv2dConfig{3, 3, 3, 1, 1},
                ReluConfig{},
                Conv2dConfig{3, 3, 3, 1, 1},
                AddConfig{},
                ReluConfig{},
                FlattenConfig{},
                LinearConfig{75, 4}};
    c.names = {"stem", "stem_relu", "conv1", "relu1", "conv2", "add", "relu2", "flat", "fc"};
    c.inputs = {{}, {}, {}, {}, {}, {"conv2", "stem_relu"}};
    return c;
  }
  c.layers = {Conv2dConfig{2, 3, 3, 1, 1},
              ReluConfig{},
              Conv2dConfig{3, 4, 3, 2, 1},
              ReluConfig{},
              Conv2dConfig{4, 4, 3, 1, 1},
              Conv2dConfig{3, 4, 1, 2, 0},
              AddConfig{},
              ReluConfig{},
              FlattenConfig{},
              LinearConfig{36, 4}};
  c.names = {"stem",     "stem_relu", "conv1", "relu1", "conv2",
             "shortcut", "add",       "relu2", "flat",  "fc"};
  c.inputs = {{}, {}, {}, {}, {}, {"stem_relu"}, {"conv2", "shortcut"}, {"add"}};
  return c;
}

TEST_P(GradientCheck, ResidualBlockWithIdentityShortcut) {
  CheckModel(ResidualBlock(/*projection=*/false), 2, Fusion::kFuse);
}

TEST_P(GradientCheck, ResidualBlockWithIdentityShortcutUnfused) {
  CheckModel(ResidualBlock(/*projection=*/false), 2, Fusion::kNone);
}

TEST_P(GradientCheck, ResidualBlockWithProjectionShortcut) {
  CheckModel(ResidualBlock(/*projection=*/true), 2, Fusion::kFuse);
}

// Channel concat of two convs and the stem itself, then a feature concat of two linears; the
// stem's output is read three times.
TEST_P(GradientCheck, ConcatOfChannelsAndFeatures) {
  ModelConfig c;
  c.input_shape = {2, 4, 4};
  c.layers = {Conv2dConfig{2, 3, 3, 1, 1},
              Conv2dConfig{3, 2, 1},
              Conv2dConfig{3, 2, 3, 1, 1},
              ConcatConfig{},
              FlattenConfig{},
              LinearConfig{7 * 16, 3},
              LinearConfig{7 * 16, 2},
              ConcatConfig{},
              LinearConfig{5, 3}};
  c.names = {"stem", "a", "b", "cat", "flat", "fc1", "fc2", "cat2", "out"};
  c.inputs = {{}, {}, {"stem"}, {"a", "b", "stem"}, {}, {}, {"flat"}, {"fc1", "fc2"}};
  CheckModel(c, 2, Fusion::kFuse);
}

// One output read twice by one add, and an add of three.
TEST_P(GradientCheck, AddOfOneOutputTwiceAndOfThree) {
  ModelConfig c;
  c.input_shape = {4};
  c.layers = {LinearConfig{4, 3}, LinearConfig{3, 3}, AddConfig{},
              LinearConfig{4, 3}, AddConfig{},        LinearConfig{3, 2}};
  c.names = {"h", "g", "twice", "k", "three", "out"};
  c.inputs = {{}, {}, {"h", "h"}, {"input"}, {"twice", "g", "k"}};
  CheckModel(c, 3, Fusion::kFuse);
}

INSTANTIATE_TEST_SUITE_P(EveryBackend, GradientCheck, ::testing::ValuesIn(Devices()),
                         testing::DeviceParamName);

}  // namespace
}  // namespace kiln
