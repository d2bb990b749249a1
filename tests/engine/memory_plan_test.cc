// The memory plan: what a job or a served model will allocate, counted from shapes alone.
#include "engine/memory_plan.h"

#include <gtest/gtest.h>

#include <limits>

#include "engine/cpu/cpu_backend.h"
#include "engine/layers/conv2d.h"
#include "engine/reference_configs.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

const MemoryNeed* Find(const MemoryPlan& plan, int layer, const std::string& what) {
  for (const MemoryNeed& n : plan.needs) {
    if (n.layer == layer && n.what == what) return &n;
  }
  return nullptr;
}

TrainConfig Mlp() { return MnistMlpReference(); }  // batch 128, SGD with momentum 0.9

// The case that took kilnd down: a wide input, a large kernel with padding, batch 1; 35k
// parameters, within every other limit, but its (then im2col) workspace needed gigabytes.
TrainConfig WideConv() {
  TrainConfig c;
  c.model.input_shape = {1, 1000, 1000};
  c.model.layers = {Conv2dConfig{1, 32, 33, 1, 16}, MaxPool2dConfig{100, 0}, FlattenConfig{},
                    LinearConfig{3200, 10}};
  c.batch_size = 1;
  c.optimizer.kind = OptimizerConfig::Kind::kAdam;
  return c;
}

TEST(MemoryPlan, TheReferenceMlpCountsItsParametersStateActivationsAndData) {
  auto plan = PlanTrainingMemory(Mlp(), 60000, 10000, {DeviceKind::kCpu, 2});
  ASSERT_OK(plan);
  const int64_t params = 784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10;
  ASSERT_NE(Find(*plan, -1, "parameters and gradients"), nullptr);
  EXPECT_EQ(Find(*plan, -1, "parameters and gradients")->bytes, 2 * params * 4);
  EXPECT_EQ(Find(*plan, -1, "optimizer state")->bytes, params * 4);  // one momentum buffer
  // Layer 0's output (512 floats) and its gradient at the evaluation batch of 1000.
  ASSERT_NE(Find(*plan, 0, "linear activations"), nullptr);
  EXPECT_EQ(Find(*plan, 0, "linear activations")->bytes, 2 * 512 * 1000 * 4);
  EXPECT_EQ(Find(*plan, -1, "conv2d workspace"), nullptr);
  // 70,000 images of 784 bytes, host and device, is the largest part; all under 1 GB.
  EXPECT_EQ(plan->largest().what, "dataset");
  EXPECT_LT(plan->total_bytes(), int64_t{1} << 30);
}

// In bf16 the CPU backend keeps bfloat16 copies of the largest GEMM's two operands: for the
// MLP at the evaluation batch of 1000, layer 0's weight gradient dW = dy^T x (512,000 + 784,000
// values) is the largest. fp32 keeps none, and neither does CUDA (cuBLAS converts in place).
TEST(MemoryPlan, Bf16CountsTheCpusBfloat16CopiesOfTheLargestGemmsOperands) {
  auto bf16 = PlanTrainingMemory(Mlp(), 60000, 10000, {DeviceKind::kCpu, 2, Precision::kBf16});
  ASSERT_OK(bf16);
  ASSERT_NE(Find(*bf16, 0, "bf16 GEMM operand copies"), nullptr);
  EXPECT_EQ(Find(*bf16, 0, "bf16 GEMM operand copies")->bytes, (512 + 784) * 1000 * 2);
  auto fp32 = PlanTrainingMemory(Mlp(), 60000, 10000, {DeviceKind::kCpu, 2, Precision::kFp32});
  ASSERT_OK(fp32);
  EXPECT_EQ(fp32->total_bytes() + (512 + 784) * 1000 * 2, bf16->total_bytes());
  auto cuda = PlanTrainingMemory(Mlp(), 60000, 10000, {DeviceKind::kCuda, 1, Precision::kBf16});
  ASSERT_OK(cuda);
  for (const MemoryNeed& need : cuda->needs) EXPECT_NE(need.what, "bf16 GEMM operand copies");
}

// Augmented training keeps an epoch's crop-and-flip decisions, 12 bytes a training sample, on
// the host and on the device; without augmentation there are none.
TEST(MemoryPlan, AugmentationCountsAnEpochsDecisions) {
  TrainConfig c = MnistCnnReference();
  auto plain = PlanTrainingMemory(c, 60000, 10000, {DeviceKind::kCuda, 1});
  ASSERT_OK(plain);
  EXPECT_EQ(Find(*plain, -1, "augmentation decisions"), nullptr);
  c.augment.random_crop_padding = 2;
  auto augmented = PlanTrainingMemory(c, 60000, 10000, {DeviceKind::kCuda, 1});
  ASSERT_OK(augmented);
  ASSERT_NE(Find(*augmented, -1, "augmentation decisions"), nullptr);
  EXPECT_EQ(Find(*augmented, -1, "augmentation decisions")->bytes, 2 * 60000 * 12);
  EXPECT_EQ(augmented->total_bytes(), plain->total_bytes() + 2 * 60000 * 12);
}

TEST(MemoryPlan, BatchNormCountsItsStatisticsAndParameters) {
  TrainConfig c;
  c.model.input_shape = {3, 8, 8};
  BatchNorm2dConfig bn;
  bn.num_features = 16;
  BatchNorm1dConfig fixed;
  fixed.num_features = 10;
  fixed.affine = false;
  c.model.layers = {Conv2dConfig{3, 16, 3, 1, 1, false}, bn, FlattenConfig{},
                    LinearConfig{1024, 10}, fixed};
  c.batch_size = 32;
  auto plan = PlanTrainingMemory(c, 100, 0, {DeviceKind::kCpu, 2});
  ASSERT_OK(plan);
  const int64_t params = 16 * 3 * 9 + 2 * 16 + 1024 * 10 + 10;
  EXPECT_EQ(Find(*plan, -1, "parameters and gradients")->bytes, 2 * params * 4);
  // Running mean and variance, saved mean and inverse std; without affine also a fixed scale,
  // shift and their two discarded gradients.
  ASSERT_NE(Find(*plan, 1, "batchnorm2d statistics"), nullptr);
  EXPECT_EQ(Find(*plan, 1, "batchnorm2d statistics")->bytes, 4 * 16 * 4);
  ASSERT_NE(Find(*plan, 4, "batchnorm1d statistics"), nullptr);
  EXPECT_EQ(Find(*plan, 4, "batchnorm1d statistics")->bytes, 8 * 10 * 4);
  EXPECT_EQ(Find(*plan, 1, "batchnorm2d activations")->bytes, 2 * 16 * 64 * 32 * 4);
}

// Batch norm as the first layer needs no input gradient, but cuDNN writes one: the CUDA backend
// puts it in scratch, which the plan counts on CUDA (and only where cuDNN runs).
TEST(MemoryPlan, BatchNormFirstCountsCudnnsInputGradientScratchOnCuda) {
  TrainConfig c;
  c.model.input_shape = {3, 8, 8};
  BatchNorm2dConfig bn;
  bn.num_features = 3;
  c.model.layers = {bn, FlattenConfig{}, LinearConfig{192, 10}};
  c.batch_size = 32;
  auto cuda = PlanTrainingMemory(c, 100, 0, {DeviceKind::kCuda, 1});
  ASSERT_OK(cuda);
  const MemoryNeed* scratch = Find(*cuda, 0, "batchnorm2d input-gradient scratch");
  ASSERT_NE(scratch, nullptr);
  EXPECT_EQ(scratch->bytes, 32 * 192 * 4);
  auto cpu = PlanTrainingMemory(c, 100, 0, {DeviceKind::kCpu, 1});
  ASSERT_OK(cpu);
  EXPECT_EQ(Find(*cpu, 0, "batchnorm2d input-gradient scratch"), nullptr);
  // (batch, features) runs kiln's own kernels, which write no input gradient nobody wants.
  TrainConfig features;
  features.model.input_shape = {20};
  BatchNorm1dConfig bn1d;
  bn1d.num_features = 20;
  features.model.layers = {bn1d, LinearConfig{20, 10}};
  features.batch_size = 32;
  auto plan = PlanTrainingMemory(features, 100, 0, {DeviceKind::kCuda, 1});
  ASSERT_OK(plan);
  EXPECT_EQ(Find(*plan, 0, "batchnorm1d input-gradient scratch"), nullptr);
}

Conv2dGeometry WideConvGeometry(int batch) {
  Conv2dGeometry g;
  g.batch = batch;
  g.in_channels = 1;
  g.in_h = g.in_w = 1000;
  g.out_channels = 32;
  g.kernel_h = g.kernel_w = 33;
  g.padding_h = g.padding_w = 16;
  return g;
}

TEST(MemoryPlan, TheConvWorkspaceIsTheLargerOfTheBackwardAndTheForwardPlanAndNamesItsLayer) {
  auto plan = PlanTrainingMemory(WideConv(), 100, 0, {DeviceKind::kCpu, 2});
  ASSERT_OK(plan);
  const int64_t backward =
      CpuBackend::ConvWorkspaceBytes(WideConvGeometry(1), 2, true, Precision::kFp32);
  const int64_t forward =
      CpuBackend::ConvWorkspaceBytes(WideConvGeometry(1), 2, false, Precision::kFp32);
  // The backward stages more than the forward: the masked gradient, dw, x for another primitive.
  EXPECT_GT(backward, forward);
  ASSERT_NE(Find(*plan, 0, "conv2d workspace"), nullptr);
  EXPECT_EQ(Find(*plan, 0, "conv2d workspace")->bytes, backward);
  // At least one copy of the output gradient (32 x 1000 x 1000 floats: masked, blocked or both).
  EXPECT_GE(backward, int64_t{32} * 1000 * 1000 * 4);

  // On a GPU cuDNN keeps within its fixed workspace limit instead.
  auto cuda = PlanTrainingMemory(WideConv(), 100, 0, {DeviceKind::kCuda, 1});
  ASSERT_OK(cuda);
  ASSERT_NE(Find(*cuda, 0, "conv2d workspace"), nullptr);
  EXPECT_EQ(Find(*cuda, 0, "conv2d workspace")->bytes, int64_t{256} << 20);
  // In bf16 with the backward's bfloat16 copies on top (conv_ops.cu: dy, x, w, dw and dx, each
  // 256-byte aligned): 64,000,000 + 2 x 2,000,128 + 2 x 69,888 bytes.
  auto cuda_bf16 = PlanTrainingMemory(WideConv(), 100, 0, {DeviceKind::kCuda, 1, Precision::kBf16});
  ASSERT_OK(cuda_bf16);
  ASSERT_NE(Find(*cuda_bf16, 0, "conv2d workspace"), nullptr);
  EXPECT_EQ(Find(*cuda_bf16, 0, "conv2d workspace")->bytes, (int64_t{256} << 20) + 68140032);
}

// The count is what the backend then holds: the same plans, made on the same number of threads
// in the same precision (bf16 stages bfloat16 copies of x, w and dy).
class CountedConvWorkspace : public ::testing::TestWithParam<Precision> {};

TEST_P(CountedConvWorkspace, IsWhatTheBackendAllocates) {
  const Precision precision = GetParam();
  Conv2dGeometry g;  // the reference CNN's second convolution
  g.batch = 64;
  g.in_channels = 32;
  g.in_h = g.in_w = 13;
  g.out_channels = 64;
  g.kernel_h = g.kernel_w = 3;
  CpuBackend backend(2, precision);
  auto x = backend.Allocate(DType::kF32, {64, 32, 13, 13});
  auto w = backend.Allocate(DType::kF32, {64, 32, 3, 3});
  auto b = backend.Allocate(DType::kF32, {64});
  auto y = backend.Allocate(DType::kF32, {64, 64, 11, 11});
  auto dy = backend.Allocate(DType::kF32, {64, 64, 11, 11});
  auto dw = backend.Allocate(DType::kF32, {64, 32, 3, 3});
  auto db = backend.Allocate(DType::kF32, {64});
  auto dx = backend.Allocate(DType::kF32, {64, 32, 13, 13});
  for (auto* t : {&x, &w, &b, &y, &dy, &dw, &db, &dx}) ASSERT_OK(*t);
  ASSERT_OK(backend.Conv2dForward(g, x->f32(), w->f32(), b->f32(), Activation::kRelu, y->f32()));
  EXPECT_EQ(backend.conv_workspace_held_bytes(),
            CpuBackend::ConvWorkspaceBytes(g, 2, false, precision));
  ASSERT_OK(backend.Conv2dBackward(g, x->f32(), w->f32(), y->f32(), dy->f32(), Activation::kRelu,
                                   dw->f32(), db->f32(), dx->f32()));
  EXPECT_EQ(backend.conv_workspace_held_bytes(),
            CpuBackend::ConvWorkspaceBytes(g, 2, true, precision));
}

INSTANTIATE_TEST_SUITE_P(MemoryPlan, CountedConvWorkspace,
                         ::testing::Values(Precision::kFp32, Precision::kBf16),
                         [](const auto& info) { return std::string(PrecisionName(info.param)); });

TEST(MemoryPlan, ServingCountsTheForwardAtTheLargestBatchAndNoOptimizer) {
  auto plan = PlanInferenceMemory(WideConv().model, 4, {DeviceKind::kCpu, 2});
  ASSERT_OK(plan);
  EXPECT_EQ(Find(*plan, -1, "optimizer state"), nullptr);
  ASSERT_NE(Find(*plan, 0, "conv2d workspace"), nullptr);
  EXPECT_EQ(Find(*plan, 0, "conv2d workspace")->bytes,
            CpuBackend::ConvWorkspaceBytes(WideConvGeometry(4), 2, false, Precision::kFp32));
  EXPECT_EQ(Find(*plan, 0, "conv2d activations")->bytes, int64_t{2} * 32 * 1000 * 1000 * 4 * 4);
}

TEST(MemoryPlan, NewLayersCountTheirActivationsAndPaddedMaxPoolItsArgmax) {
  TrainConfig c;
  Conv2dConfig conv{3, 8, 3, 1, 1, false};
  conv.kernel_w = 5;
  conv.padding_w = 2;
  c.model.input_shape = {3, 32, 32};
  c.model.layers = {conv,
                    GeluConfig{},
                    MaxPool2dConfig{3, 2, 1},
                    AvgPool2dConfig{3, 1, 1},
                    SiluConfig{},
                    AdaptiveAvgPool2dConfig{},
                    FlattenConfig{},
                    LinearConfig{8, 10}};
  c.batch_size = 16;
  c.optimizer.kind = OptimizerConfig::Kind::kAdam;
  auto plan = PlanTrainingMemory(c, 100, 0, {DeviceKind::kCpu, 2});
  ASSERT_OK(plan) << plan.status();
  // The batch buffers are sized for 1000 (the evaluation batch); activations for 16 here.
  ASSERT_NE(Find(*plan, 1, "gelu activations"), nullptr);
  EXPECT_EQ(Find(*plan, 1, "gelu activations")->bytes, int64_t{2} * 8 * 32 * 32 * 16 * 4);
  ASSERT_NE(Find(*plan, 2, "maxpool2d argmax"), nullptr);
  EXPECT_EQ(Find(*plan, 2, "maxpool2d argmax")->bytes, int64_t{8} * 16 * 16 * 16 * 4);
  ASSERT_NE(Find(*plan, 3, "avgpool2d activations"), nullptr);
  ASSERT_NE(Find(*plan, 5, "adaptive_avgpool2d activations"), nullptr);
  EXPECT_EQ(Find(*plan, 5, "adaptive_avgpool2d activations")->bytes, int64_t{2} * 8 * 16 * 4);
  ASSERT_NE(Find(*plan, 0, "conv2d workspace"), nullptr);
  EXPECT_EQ(
      Find(*plan, 0, "conv2d workspace")->bytes,
      CpuBackend::ConvWorkspaceBytes(MakeConv2dGeometry(conv, c.model.input_shape, c.batch_size), 2,
                                     true, Precision::kFp32));
}

TEST(MemoryPlan, HostileSizesSaturateInsteadOfWrappingAround) {
  TrainConfig c = WideConv();
  c.batch_size = 65536;
  auto plan =
      PlanTrainingMemory(c, std::numeric_limits<int64_t>::max() / 2, 0, {DeviceKind::kCpu, 64});
  ASSERT_OK(plan);
  EXPECT_EQ(plan->total_bytes(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(FormatBytes(999), "999 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
}

TEST(MemoryPlan, AModelWhoseShapesDoNotCheckOutIsAnError) {
  TrainConfig c = Mlp();
  c.model.input_shape = {100};
  EXPECT_EQ(PlanTrainingMemory(c, 1, 0, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

// A GPT's layers count what they keep: attention its q, k, v split out, its B x H x T x T weights
// and their gradient, its heads; layernorm each position's mean and rstd.
TEST(MemoryPlan, SequenceLayersCountTheirSavedBuffers) {
  TrainConfig c;
  c.model.input_shape = {8};  // T = 8 token ids
  c.model.layers = {EmbeddingConfig{16, 8}, CausalSelfAttentionConfig{2, 8}, LayerNormConfig{8}};
  c.batch_size = 4;
  auto plan = PlanTrainingMemory(c, 100, 0, {DeviceKind::kCpu, 1});
  ASSERT_OK(plan) << plan.status();
  // 4 x (q, k, v) values (qkv, the split's middle step, q k v, their gradients) of 8 x 8, the
  // weights and their gradient (2 x 8 x 8 each), heads and merged (8 x 8 each); 4 samples.
  const int64_t per_sample = 4 * 3 * 64 + 2 * 128 + 2 * 64;
  ASSERT_NE(Find(*plan, 1, "causal_self_attention buffers"), nullptr);
  EXPECT_EQ(Find(*plan, 1, "causal_self_attention buffers")->bytes, per_sample * 4 * 4);
  ASSERT_NE(Find(*plan, 2, "layernorm statistics"), nullptr);
  EXPECT_EQ(Find(*plan, 2, "layernorm statistics")->bytes, 2 * 8 * 4 * 4);
  // With dropout, the dropped weights, both masks and c_proj's output before its dropout.
  c.model.layers[1] = CausalSelfAttentionConfig{2, 8, true, 0.1f};
  plan = PlanTrainingMemory(c, 100, 0, {DeviceKind::kCpu, 1});
  ASSERT_OK(plan);
  EXPECT_EQ(Find(*plan, 1, "causal_self_attention buffers")->bytes,
            (per_sample + 2 * 128 + 2 * 64) * 4 * 4);
}

// A token run's shards stay mapped: the plan counts a batch's windows, not the corpus, and its
// evaluation batches are its training batches' size (not kEvalBatchSize).
TEST(MemoryPlan, ATokenRunCountsItsWindowsNotItsCorpus) {
  TrainConfig c;
  c.model.input_shape = {8};
  c.model.layers = {EmbeddingConfig{16, 8}, CausalSelfAttentionConfig{2, 8}, LinearConfig{8, 16}};
  c.batch_size = 4;
  c.max_iters = 10;
  c.eval_interval = 10;
  const int64_t corpus = int64_t{1} << 40;  // a terabyte of tokens
  auto plan = PlanTrainingMemory(c, corpus, corpus / 10, {DeviceKind::kCpu, 1});
  ASSERT_OK(plan) << plan.status();
  EXPECT_EQ(Find(*plan, -1, "dataset"), nullptr);
  ASSERT_NE(Find(*plan, -1, "token windows"), nullptr);
  EXPECT_EQ(Find(*plan, -1, "token windows")->bytes, 2 * 4 * 8 * 4);
  EXPECT_LT(plan->total_bytes(), int64_t{1} << 20);
}

}  // namespace
}  // namespace kiln
