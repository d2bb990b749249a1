// Numeric gradient checks (central differences) of every layer and loss against Backward, one
// test body run over every backend ("cpu", "cuda:0"); a backend not present on this machine
// skips, saying why.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend_registry.h"
#include "engine/layers/batchnorm.h"
#include "engine/layers/conv2d.h"
#include "engine/layers/dropout.h"
#include "engine/layers/flatten.h"
#include "engine/layers/linear.h"
#include "engine/layers/maxpool2d.h"
#include "engine/layers/relu.h"
#include "engine/layers/softmax.h"
#include "engine/loss.h"
#include "engine/model.h"
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

// Every branch of im2col/col2im: plain, padded, strided, non-square, several channels.
struct ConvCase {
  int c, h, w, oc, k, stride, pad;
};
class ConvGradient : public GradientCheckBase,
                     public ::testing::WithParamInterface<std::tuple<std::string, ConvCase>> {
 protected:
  void SetUp() override { UseBackend(std::get<0>(GetParam())); }
};

TEST_P(ConvGradient, MatchesFiniteDifferences) {
  const ConvCase p = std::get<1>(GetParam());
  Conv2dConfig cfg{p.c, p.oc, p.k, p.stride, p.pad, true};
  auto shapes = InferShapes({{p.c, p.h, p.w}, {cfg}});
  ASSERT_OK(shapes) << shapes.status();
  auto layer = Conv2d::Create(cfg, backend_.get(), (*shapes)[0], (*shapes)[1], &rng_);
  ASSERT_OK(layer);
  CheckLayer(**layer, 2, RandomValues(2 * p.c * p.h * p.w, 3));
}

// Named by shape and device: "c2_5x4_oc3_k3_s1_p1_cuda_0".
std::string ConvCaseName(const ::testing::TestParamInfo<std::tuple<std::string, ConvCase>>& info) {
  const ConvCase& p = std::get<1>(info.param);
  return absl::StrCat("c", p.c, "_", p.h, "x", p.w, "_oc", p.oc, "_k", p.k, "_s", p.stride, "_p",
                      p.pad, "_", testing::DeviceTestName(std::get<0>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(Shapes, ConvGradient,
                         ::testing::Combine(::testing::ValuesIn(Devices()),
                                            ::testing::Values(ConvCase{1, 5, 5, 2, 3, 1, 0},
                                                              ConvCase{2, 5, 4, 3, 3, 1, 1},
                                                              ConvCase{2, 7, 6, 2, 3, 2, 0},
                                                              ConvCase{3, 6, 6, 2, 2, 2, 1},
                                                              ConvCase{1, 4, 4, 1, 1, 1, 0},
                                                              ConvCase{1, 6, 5, 2, 3, 1, 1},
                                                              ConvCase{1, 6, 6, 2, 5, 1, 2})),
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
void CheckLoss(Backend& b, LossKind kind) {
  const int rows = 4, cols = 5;
  std::vector<float> z = RandomValues(rows * cols, 11, -2, 2);
  Tensor logits = MakeTensor(b, {rows, cols}, z);
  auto labels = b.Allocate(DType::kI32, {rows});
  const std::vector<int32_t> lab = {0, 3, 4, 1};
  ASSERT_OK(b.CopyFromHost(lab.data(), 16, &*labels));
  auto scalar = b.Allocate(DType::kF32, {1});
  auto correct = b.Allocate(DType::kI32, {1});
  auto dz = b.Allocate(DType::kF32, {rows, cols});
  Loss loss(kind, &b);
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

INSTANTIATE_TEST_SUITE_P(EveryBackend, GradientCheck, ::testing::ValuesIn(Devices()),
                         testing::DeviceParamName);

}  // namespace
}  // namespace kiln
