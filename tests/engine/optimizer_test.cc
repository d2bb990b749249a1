// Optimizer steps against values computed by PyTorch 1.13 (torch.optim) for the same parameter,
// gradients and hyperparameters: three steps from p = [1, -2, 0.5].
#include "engine/optim/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>

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

// OneCycle rewrites SGD's momentum and Adam's beta1 before each step: set_momentum(m) on an
// optimizer configured otherwise steps exactly as one configured with m.
TEST(OptimizerMomentum, SetMomentumStepsAsIfConfiguredSo) {
  auto backend = CreateBackend("cpu", {1});
  ASSERT_OK(backend);
  Backend& b = **backend;
  for (OptimizerConfig::Kind kind : {OptimizerConfig::Kind::kSgd, OptimizerConfig::Kind::kAdam}) {
    const bool sgd = kind == OptimizerConfig::Kind::kSgd;
    OptimizerConfig configured = sgd ? Sgd(0.1f, 0.5f) : Adam(kind, 0.1f);
    OptimizerConfig overridden = configured;
    if (sgd) {
      overridden.momentum = 0.9f;
    } else {
      configured.beta1 = 0.7f;
    }
    Parameter p[2];
    std::unique_ptr<Optimizer> opt[2];
    for (int i = 0; i < 2; ++i) {
      p[i].value = MakeTensor(b, {3}, {1.0f, -2.0f, 0.5f});
      p[i].grad = MakeTensor(b, {3}, {0.1f, -0.2f, 0.3f});
      auto o = Optimizer::Create(i == 0 ? configured : overridden, &b, {{"0.weight", &p[i]}});
      ASSERT_OK(o);
      opt[i] = std::move(*o);
    }
    for (int step = 0; step < 3; ++step) {
      opt[1]->set_momentum(sgd ? 0.5f : 0.7f);
      for (int i = 0; i < 2; ++i) ASSERT_OK(opt[i]->Step(0.1f));
    }
    EXPECT_EQ(ToHost(b, p[0].value), ToHost(b, p[1].value)) << (sgd ? "sgd" : "adam");
  }
}

// kMatrices decays only parameters of 2+ dimensions (nanoGPT's AdamW groups): after one step a
// 1-D bias and a 1-D LayerNorm weight move by the gradient's part alone, a 2-D weight also decays.
TEST(OptimizerDecayRule, MatricesDecayOnlyParametersOfTwoOrMoreDimensions) {
  auto backend = CreateBackend("cpu", {1});
  ASSERT_OK(backend);
  Backend& b = **backend;
  const double lr = 0.1, wd = 0.5;
  for (OptimizerConfig::Kind kind : {OptimizerConfig::Kind::kAdamW, OptimizerConfig::Kind::kSgd}) {
    OptimizerConfig c =
        kind == OptimizerConfig::Kind::kSgd ? Sgd(0.1f, 0, 0, 0.5f) : Adam(kind, 0.1f, 0.5f);
    c.decay_rule = OptimizerConfig::DecayRule::kMatrices;
    Parameter weight, bias, ln_weight;
    weight.value = MakeTensor(b, {2, 2}, {1.0f, -2.0f, 0.5f, 3.0f});
    weight.grad = MakeTensor(b, {2, 2}, {0.1f, -0.2f, 0.3f, 0.4f});
    bias.value = MakeTensor(b, {2}, {1.0f, -2.0f});
    bias.grad = MakeTensor(b, {2}, {0.1f, -0.2f});
    ln_weight.value = MakeTensor(b, {2}, {0.5f, 3.0f});
    ln_weight.grad = MakeTensor(b, {2}, {0.3f, 0.4f});
    auto opt = Optimizer::Create(
        c, &b, {{"0.weight", &weight}, {"0.bias", &bias}, {"1.weight", &ln_weight}});
    ASSERT_OK(opt);
    ASSERT_OK((*opt)->Step(0.1f));
    // Step 1 of AdamW: p (1 - lr wd) - lr g / (|g| + eps); of SGD: p - lr (g + wd p).
    auto expected = [&](double p, double g, bool decays) {
      if (kind == OptimizerConfig::Kind::kSgd) return p - lr * (g + (decays ? wd * p : 0.0));
      return p * (decays ? 1.0 - lr * wd : 1.0) - lr * g / (std::abs(g) + 1e-8);
    };
    const std::vector<float> w = ToHost(b, weight.value), bs = ToHost(b, bias.value),
                             ln = ToHost(b, ln_weight.value);
    const char* name = kind == OptimizerConfig::Kind::kSgd ? "sgd" : "adamw";
    EXPECT_NEAR(w[0], expected(1.0, 0.1, true), 1e-6) << name;
    EXPECT_NEAR(w[3], expected(3.0, 0.4, true), 1e-6) << name;
    EXPECT_NEAR(bs[0], expected(1.0, 0.1, false), 1e-6) << name;
    EXPECT_NEAR(bs[1], expected(-2.0, -0.2, false), 1e-6) << name;
    EXPECT_NEAR(ln[0], expected(0.5, 0.3, false), 1e-6) << name;
    EXPECT_NEAR(ln[1], expected(3.0, 0.4, false), 1e-6) << name;
  }
}

// The default rule decays every parameter, 1-D ones too (PyTorch's single param group).
TEST(OptimizerDecayRule, AllDecaysOneDimensionalParametersToo) {
  auto backend = CreateBackend("cpu", {1});
  ASSERT_OK(backend);
  Backend& b = **backend;
  Parameter bias;
  bias.value = MakeTensor(b, {2}, {1.0f, -2.0f});
  bias.grad = MakeTensor(b, {2}, {0.1f, -0.2f});
  auto opt =
      Optimizer::Create(Adam(OptimizerConfig::Kind::kAdamW, 0.1f, 0.5f), &b, {{"0.bias", &bias}});
  ASSERT_OK(opt);
  ASSERT_OK((*opt)->Step(0.1f));
  EXPECT_NEAR(ToHost(b, bias.value)[0], 1.0 * (1 - 0.05) - 0.1 * 0.1 / (0.1 + 1e-8), 1e-6);
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
  EXPECT_FALSE(ValidateSchedule(step, 0.1f).ok());
}

// torch.optim.lr_scheduler.OneCycleLR, the rates each of the run's steps ran with (the param
// group's lr and momentum or betas[0] before opt.step()), printed by torch 1.13.
TEST(LrSchedule, OneCycleFollowsPyTorch) {
  LrScheduleConfig cos;
  cos.kind = LrScheduleConfig::Kind::kOneCycle;  // defaults: pct 0.3, cos, 25, 1e4, 0.85-0.95
  const float cos_lr[] = {0.004f,        0.052f,        0.1f,          0.0950484632f, 0.0811745654f,
                          0.0611262022f, 0.0388741978f, 0.0188258346f, 0.0049519368f, 4e-07f};
  const float cos_momentum[] = {0.95f,        0.9f,         0.85f,       0.854951557f, 0.86882551f,
                                0.888873953f, 0.911126047f, 0.93117449f, 0.945048443f, 0.95f};
  for (int step = 0; step < 10; ++step) {
    // Two epochs of five steps.
    const ScheduledRates r = ScheduledRatesAt(0.1f, cos, {step / 5, 2, step, 5});
    EXPECT_NEAR(r.lr, cos_lr[step], 1e-7) << step;
    ASSERT_TRUE(r.momentum.has_value());
    EXPECT_NEAR(*r.momentum, cos_momentum[step], 1e-6) << step;
  }
  LrScheduleConfig linear = cos;
  linear.pct_start = 0.25f;
  linear.anneal = LrScheduleConfig::Anneal::kLinear;
  linear.div_factor = 10;
  linear.final_div_factor = 100;
  const float linear_lr[] = {0.001f,         0.00952428571f, 0.00762142857f, 0.00571857143f,
                             0.00381571429f, 0.00191285714f, 1e-05f};
  const float linear_beta1[] = {0.95f,        0.854761905f, 0.873809524f, 0.892857143f,
                                0.911904762f, 0.930952381f, 0.95f};
  for (int step = 0; step < 7; ++step) {
    const ScheduledRates r = ScheduledRatesAt(0.01f, linear, {0, 1, step, 7});
    EXPECT_NEAR(r.lr, linear_lr[step], 1e-8) << step;
    EXPECT_NEAR(*r.momentum, linear_beta1[step], 1e-6) << step;
  }
  linear.cycle_momentum = false;
  EXPECT_FALSE(ScheduledRatesAt(0.01f, linear, {0, 1, 3, 7}).momentum.has_value());
  // Per-epoch schedules leave momentum alone.
  EXPECT_FALSE(ScheduledRatesAt(0.01f, LrScheduleConfig{}, {0, 1, 3, 7}).momentum.has_value());

  LrScheduleConfig bad = cos;
  bad.pct_start = 1.0f;
  EXPECT_FALSE(ValidateSchedule(bad, 0.01f).ok());
  bad = cos;
  bad.div_factor = 0.5f;
  EXPECT_FALSE(ValidateSchedule(bad, 0.01f).ok());
  bad = cos;
  bad.base_momentum = 0.99f;
  EXPECT_FALSE(ValidateSchedule(bad, 0.01f).ok());
  EXPECT_OK(ValidateSchedule(cos, 0.01f));
}

LrScheduleConfig WarmupCosine(int64_t warmup, int64_t decay, float min_lr) {
  LrScheduleConfig s;
  s.kind = LrScheduleConfig::Kind::kWarmupCosine;
  s.warmup_iters = warmup;
  s.lr_decay_iters = decay;
  s.eta_min = min_lr;
  return s;
}

// nanoGPT's get_lr (the torch GPT peer's lr_at) for lr 1e-3, min_lr 1e-4, warmup 10,
// lr_decay_iters 110, printed by Python in double.
TEST(LrSchedule, WarmupCosineFollowsNanoGpt) {
  const LrScheduleConfig s = WarmupCosine(10, 110, 1e-4f);
  const struct {
    int64_t it;
    double lr;
  } expected[] = {{0, 9.090909090909092e-05},  // the first warm-up step: lr / (warmup + 1)
                  {9, 0.0009090909090909091},  // the last one
                  {10, 0.001},                 // the peak
                  {35, 0.0008681980515339464},
                  {60, 0.00055},  // half way down
                  {109, 0.00010022204783542078},
                  {110, 0.0001},   // the end: min_lr
                  {200, 0.0001}};  // and past it
  for (const auto& e : expected) {
    // 4 epochs of 50 steps: the per-step schedule ignores epochs (lr_decay_iters is given).
    const ScheduledRates r = ScheduledRatesAt(1e-3f, s, {static_cast<int>(e.it / 50), 4, e.it, 50});
    EXPECT_FLOAT_EQ(r.lr, static_cast<float>(e.lr)) << "iteration " << e.it;
    EXPECT_FALSE(r.momentum.has_value());
  }
}

TEST(LrSchedule, WarmupCosineDecaysOverTheRunWhenLrDecayItersIsZero) {
  const LrScheduleConfig s = WarmupCosine(10, 0, 1e-4f);
  // 4 epochs of 25 steps: 100 steps, so half way down at 55 and nearly min_lr at the last.
  EXPECT_FLOAT_EQ(ScheduledRatesAt(1e-3f, s, {2, 4, 55, 25}).lr, 0.00055f);
  EXPECT_FLOAT_EQ(ScheduledRatesAt(1e-3f, s, {3, 4, 99, 25}).lr,
                  static_cast<float>(0.00010027412784140692));
  // No warm-up: the first step runs at the peak.
  EXPECT_FLOAT_EQ(ScheduledRatesAt(1e-3f, WarmupCosine(0, 0, 0), {0, 4, 0, 25}).lr, 1e-3f);
}

TEST(LrSchedule, WarmupCosineRejectsBadFields) {
  auto message = [](const LrScheduleConfig& s, float lr) {
    return std::string(ValidateSchedule(s, lr).message());
  };
  EXPECT_OK(ValidateSchedule(WarmupCosine(100, 5000, 1e-4f), 1e-3f));
  EXPECT_OK(ValidateSchedule(WarmupCosine(0, 0, 1e-3f), 1e-3f));
  EXPECT_NE(message(WarmupCosine(-1, 0, 0), 1e-3f).find("warmup_iters"), std::string::npos);
  EXPECT_NE(message(WarmupCosine(0, -5, 0), 1e-3f).find("lr_decay_iters"), std::string::npos);
  EXPECT_NE(message(WarmupCosine(100, 50, 0), 1e-3f).find("lr_decay_iters"), std::string::npos);
  EXPECT_NE(message(WarmupCosine(0, 0, -1e-4f), 1e-3f).find("min_lr"), std::string::npos);
  EXPECT_NE(message(WarmupCosine(0, 0, 2e-3f), 1e-3f).find("min_lr"), std::string::npos);
}

}  // namespace
}  // namespace kiln
