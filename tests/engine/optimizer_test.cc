// Optimizer steps against values computed by PyTorch 1.13 (torch.optim) for the same parameter,
// gradients and hyperparameters: three steps from p = [1, -2, 0.5].
#include "engine/optim/optimizer.h"

#include <gtest/gtest.h>

#include "engine/backend_registry.h"
#include "engine/optim/lr_schedule.h"
#include "tests/engine/test_util.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

using testing::MakeTensor;
using testing::ToHost;

struct OptimCase {
  const char* name;
  OptimizerConfig config;
  std::vector<float> expected;  // torch's parameter after the three steps
};

OptimizerConfig Sgd(float lr, float momentum = 0, float dampening = 0, float wd = 0,
                    bool nesterov = false) {
  OptimizerConfig c;
  c.kind = OptimizerConfig::Kind::kSgd;
  c.lr = lr;
  c.momentum = momentum;
  c.dampening = dampening;
  c.weight_decay = wd;
  c.nesterov = nesterov;
  return c;
}

OptimizerConfig Adam(OptimizerConfig::Kind kind, float lr, float wd = 0) {
  OptimizerConfig c;
  c.kind = kind;
  c.lr = lr;
  c.weight_decay = wd;
  return c;
}

class OptimizerMatchesTorch : public ::testing::TestWithParam<OptimCase> {};

TEST_P(OptimizerMatchesTorch, ThreeSteps) {
  auto backend = CreateBackend("cpu", {1});
  ASSERT_OK(backend);
  Backend& b = **backend;
  Parameter p;
  p.name = "weight";
  p.value = MakeTensor(b, {3}, {1.0f, -2.0f, 0.5f});
  p.grad = MakeTensor(b, {3}, {0, 0, 0});
  auto opt = Optimizer::Create(GetParam().config, &b, {{"0.weight", &p}});
  ASSERT_OK(opt) << opt.status();
  const std::vector<std::vector<float>> grads = {
      {0.1f, -0.2f, 0.3f}, {-0.05f, 0.4f, 0.0f}, {0.2f, 0.1f, -0.3f}};
  for (const auto& g : grads) {
    ASSERT_OK(b.CopyFromHost(g.data(), 12, &p.grad));
    ASSERT_OK((*opt)->Step(GetParam().config.lr));
  }
  const std::vector<float> got = ToHost(b, p.value);
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(got[i], GetParam().expected[i], 2e-6f) << GetParam().name << " element " << i;
  }
  EXPECT_EQ((*opt)->steps(), 3);
}

INSTANTIATE_TEST_SUITE_P(
    Torch, OptimizerMatchesTorch,
    ::testing::Values(
        OptimCase{"SgdPlain", Sgd(0.1f), {9.750000238e-01f, -2.029999971e+00f, 5.000000000e-01f}},
        OptimCase{"SgdMomentum",
                  Sgd(0.1f, 0.9f),
                  {9.624000192e-01f, -2.031800032e+00f, 4.486999810e-01f}},
        OptimCase{"SgdDampeningDecay",
                  Sgd(0.1f, 0.9f, 0.1f, 0.01f),
                  {9.581643939e-01f, -2.012604475e+00f, 4.431446791e-01f}},
        OptimCase{"SgdNesterov",
                  Sgd(0.1f, 0.9f, 0, 0.01f, true),
                  {9.332097769e-01f, -2.042611122e+00f, 4.501212239e-01f}},
        OptimCase{"Adam",
                  Adam(OptimizerConfig::Kind::kAdam, 0.01f),
                  {9.807555079e-01f, -1.997817516e+00f, 4.841580987e-01f}},
        OptimCase{"AdamL2",
                  Adam(OptimizerConfig::Kind::kAdam, 0.01f, 0.1f),
                  {9.728278518e-01f, -1.983983040e+00f, 4.812148213e-01f}},
        OptimCase{"AdamW",
                  Adam(OptimizerConfig::Kind::kAdamW, 0.01f, 0.1f),
                  {9.777812362e-01f, -1.991840005e+00f, 4.826863110e-01f}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(OptimizerConfigCheck, RejectsBadHyperparameters) {
  auto backend = CreateBackend("cpu", {1});
  ASSERT_OK(backend);
  auto bad_nesterov = Optimizer::Create(Sgd(0.1f, 0, 0, 0, true), backend->get(), {});
  EXPECT_FALSE(bad_nesterov.ok());
  EXPECT_NE(bad_nesterov.status().message().find("nesterov"), std::string::npos);
  auto bad_lr = Optimizer::Create(Sgd(-1), backend->get(), {});
  EXPECT_NE(bad_lr.status().message().find("lr"), std::string::npos);
  OptimizerConfig adam = Adam(OptimizerConfig::Kind::kAdam, 0.1f);
  adam.beta1 = 1.0f;
  EXPECT_NE(Optimizer::Create(adam, backend->get(), {}).status().message().find("betas"),
            std::string::npos);
}

TEST(LrSchedule, StepAndCosineFollowPyTorch) {
  LrScheduleConfig step;
  step.kind = LrScheduleConfig::Kind::kStep;
  step.step_size = 2;
  step.gamma = 0.5f;
  EXPECT_FLOAT_EQ(ScheduledLearningRate(0.1f, step, 0, 10), 0.1f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(0.1f, step, 1, 10), 0.1f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(0.1f, step, 2, 10), 0.05f);
  EXPECT_FLOAT_EQ(ScheduledLearningRate(0.1f, step, 5, 10), 0.025f);
  LrScheduleConfig cosine;
  cosine.kind = LrScheduleConfig::Kind::kCosine;
  cosine.eta_min = 0.0f;
  EXPECT_FLOAT_EQ(ScheduledLearningRate(0.1f, cosine, 0, 4), 0.1f);
  EXPECT_NEAR(ScheduledLearningRate(0.1f, cosine, 2, 4), 0.05f, 1e-7);
  EXPECT_NEAR(ScheduledLearningRate(0.1f, cosine, 4, 4), 0.0f, 1e-7);
  LrScheduleConfig constant;
  EXPECT_FLOAT_EQ(ScheduledLearningRate(0.1f, constant, 7, 10), 0.1f);
  step.step_size = 0;
  EXPECT_FALSE(ValidateSchedule(step).ok());
}

}  // namespace
}  // namespace kiln
