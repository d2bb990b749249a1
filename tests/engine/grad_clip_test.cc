// ClipGradNorm against torch.nn.utils.clip_grad_norm_'s formula: total = sqrt(sum of every
// gradient's squares), coef = max_norm / (total + 1e-6), gradients *= coef when coef < 1. Run on
// the CPU, and on CUDA where a device is found.
#include "engine/optim/grad_clip.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "tests/engine/test_util.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

using testing::MakeTensor;
using testing::RandomValues;
using testing::ToHost;

class ClipGradNormTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string absent = testing::AbsentDeviceReason(GetParam());
    if (!absent.empty()) GTEST_SKIP() << absent;
    auto b = CreateBackend(GetParam());
    ASSERT_OK(b);
    backend_ = std::move(*b);
    auto s = backend_->Allocate(DType::kF32, {1});
    ASSERT_OK(s);
    scratch_ = *s;
  }

  // A parameter of `shape` whose gradient holds `grad` (the value is never read).
  Parameter& Add(const std::string& name, const Shape& shape, const std::vector<float>& grad) {
    auto p = std::make_unique<Parameter>();
    p->name = name;
    p->value = MakeTensor(*backend_, shape, std::vector<float>(grad.size(), 1.0f));
    p->grad = MakeTensor(*backend_, shape, grad);
    named_.push_back({name, p.get()});
    owned_.push_back(std::move(p));
    return *owned_.back();
  }
  std::vector<float> Grad(int i) { return ToHost(*backend_, owned_[i]->grad); }

  std::unique_ptr<Backend> backend_;
  Tensor scratch_;
  std::vector<std::unique_ptr<Parameter>> owned_;
  std::vector<NamedParameter> named_;
};

TEST_P(ClipGradNormTest, ReturnsTheGlobalNormComputedByHand) {
  Add("0.weight", {2, 2}, {3.0f, 0.0f, 0.0f, 4.0f});  // 9 + 16
  Add("0.bias", {1}, {-12.0f});                       // + 144: the norm is 13
  auto total = ClipGradNorm(backend_.get(), named_, 100.0f, &scratch_);
  ASSERT_OK(total);
  EXPECT_EQ(*total, 13.0f);
}

TEST_P(ClipGradNormTest, ANormWithinTheLimitLeavesGradientsBitForBit) {
  const std::vector<float> a = RandomValues(1000, 1), b = RandomValues(37, 2);
  Add("0.weight", {10, 100}, a);
  Add("0.bias", {37}, b);
  // The norm is about sqrt(1037 / 3) = 18.6, under the limit (and the limit equal to it).
  auto total = ClipGradNorm(backend_.get(), named_, 20.0f, &scratch_);
  ASSERT_OK(total);
  EXPECT_LT(*total, 20.0f);
  EXPECT_EQ(Grad(0), a);
  EXPECT_EQ(Grad(1), b);
}

TEST_P(ClipGradNormTest, ANormOverTheLimitScalesEveryGradientByTorchsCoefficient) {
  Add("0.weight", {2, 2}, {3.0f, 0.0f, 0.0f, 4.0f});
  Add("0.bias", {1}, {-12.0f});
  auto total = ClipGradNorm(backend_.get(), named_, 1.3f, &scratch_);
  ASSERT_OK(total);
  EXPECT_EQ(*total, 13.0f);  // the norm before clipping
  const float coef = 1.3f / (13.0f + 1e-6f);
  EXPECT_EQ(Grad(0), (std::vector<float>{3.0f * coef, 0.0f, 0.0f, 4.0f * coef}));
  EXPECT_EQ(Grad(1), (std::vector<float>{-12.0f * coef}));
}

// As torch computes it: the norm of the parameters' norms, then the clipped gradients' norm is
// max_norm (less the 1e-6).
TEST_P(ClipGradNormTest, MatchesTorchsFormulaOverManyParameters) {
  const std::vector<int64_t> sizes = {65 * 128, 128, 3 * 128 * 128, 1, 300001};
  double norms_squared = 0;
  std::vector<std::vector<float>> grads;
  for (size_t i = 0; i < sizes.size(); ++i) {
    grads.push_back(RandomValues(sizes[i], 10 + static_cast<uint32_t>(i), -0.5f, 0.5f));
    double sq = 0;
    for (float g : grads.back()) sq += static_cast<double>(g) * g;
    norms_squared += sq;  // torch.norm(stack([g.norm() for g])) squared
    Add(std::to_string(i) + ".weight", {sizes[i]}, grads.back());
  }
  const double expected = std::sqrt(norms_squared);
  auto total = ClipGradNorm(backend_.get(), named_, 1.0f, &scratch_);
  ASSERT_OK(total);
  EXPECT_NEAR(*total, expected, expected * 1e-6);
  const double coef = 1.0 / (expected + 1e-6);
  double clipped_squared = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::vector<float> got = Grad(static_cast<int>(i));
    for (size_t j = 0; j < got.size(); j += 997) {
      ASSERT_NEAR(got[j], grads[i][j] * coef, 1e-6 * std::abs(grads[i][j] * coef) + 1e-12);
    }
    for (float g : got) clipped_squared += static_cast<double>(g) * g;
  }
  EXPECT_NEAR(std::sqrt(clipped_squared), 1.0, 1e-5);
}

TEST_P(ClipGradNormTest, NoParametersHaveNormZero) {
  auto total = ClipGradNorm(backend_.get(), named_, 1.0f, &scratch_);
  ASSERT_OK(total);
  EXPECT_EQ(*total, 0.0f);
}

TEST_P(ClipGradNormTest, ABadMaxNormIsInvalidArgument) {
  Add("0.bias", {2}, {1.0f, 2.0f});
  for (float max_norm : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(),
                         std::numeric_limits<float>::infinity()}) {
    const absl::Status st = ClipGradNorm(backend_.get(), named_, max_norm, &scratch_).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << max_norm;
    EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("max_norm")) << st;
  }
  EXPECT_EQ(ClipGradNorm(backend_.get(), named_, 1.0f, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(ClipGradNormTest, ANonFiniteGradientFailsNamingItsParameter) {
  Add("0.weight", {2}, {1.0f, 2.0f});
  Add("1.bias", {3}, {1.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f});
  absl::Status st = ClipGradNorm(backend_.get(), named_, 1.0f, &scratch_).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("1.bias's gradient holds NaN"));
  const std::vector<float> unchanged = Grad(0);
  EXPECT_EQ(unchanged, (std::vector<float>{1.0f, 2.0f}));

  named_.clear();
  owned_.clear();
  Add("0.weight", {2}, {1.0f, std::numeric_limits<float>::infinity()});
  st = ClipGradNorm(backend_.get(), named_, 1.0f, &scratch_).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("0.weight's gradient is infinite"));
}

INSTANTIATE_TEST_SUITE_P(EveryBackend, ClipGradNormTest, ::testing::Values("cpu", "cuda:0"),
                         testing::DeviceParamName);

}  // namespace
}  // namespace kiln
