#include "server/jobs/spec_translation.h"

#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::server {
namespace {

TEST(SpecTranslationTest, MnistMlpPresetIsTheReferenceConfiguration) {
  v1::JobSpec spec;
  spec.set_preset("mnist-mlp");
  spec.set_epochs(10);
  auto config = TranslateSpec(spec, SpecLimits());
  ASSERT_OK(config) << config.status();
  EXPECT_EQ(config->model.input_shape, (Shape{784}));
  EXPECT_EQ(config->model.layers.size(), MnistMlpConfig().layers.size());
  EXPECT_EQ(config->optimizer.kind, OptimizerConfig::Kind::kSgd);
  EXPECT_FLOAT_EQ(config->optimizer.lr, 0.001f);
  EXPECT_FLOAT_EQ(config->optimizer.momentum, 0.9f);
  EXPECT_EQ(config->batch_size, 128);
  EXPECT_FLOAT_EQ(config->norm.scale, 1.0f / 255.0f);
  EXPECT_FLOAT_EQ(config->norm.mean, 0.5f);
  EXPECT_FLOAT_EQ(config->norm.std, 0.5f);
  EXPECT_EQ(config->epochs, 10);
}

TEST(SpecTranslationTest, MnistCnnPresetIsTheReferenceConfiguration) {
  v1::JobSpec spec;
  spec.set_preset("mnist-cnn");
  spec.set_epochs(1);
  auto config = TranslateSpec(spec, SpecLimits());
  ASSERT_OK(config) << config.status();
  EXPECT_EQ(config->model.input_shape, (Shape{1, 28, 28}));
  EXPECT_EQ(config->optimizer.kind, OptimizerConfig::Kind::kAdam);
  EXPECT_FLOAT_EQ(config->optimizer.lr, 1e-3f);
  EXPECT_EQ(config->batch_size, 64);
  EXPECT_FLOAT_EQ(config->norm.mean, 0.0f);
  EXPECT_FLOAT_EQ(config->norm.std, 1.0f);
}

TEST(SpecTranslationTest, PerChannelNormalisationIsTranslatedAndCheckedFieldByField) {
  v1::JobSpec spec = testing::SmallColourSpec("c10", 1);
  v1::PixelNormSpec* norm = spec.mutable_normalization();
  norm->set_scale(1.0f / 255.0f);
  for (float m : {0.4914f, 0.4822f, 0.4465f}) norm->add_channel_mean(m);
  for (float s : {0.2470f, 0.2435f, 0.2616f}) norm->add_channel_std(s);
  auto config = TranslateSpec(spec, SpecLimits());
  ASSERT_OK(config);
  EXPECT_THAT(config->norm.channel_mean, ::testing::ElementsAre(0.4914f, 0.4822f, 0.4465f));
  EXPECT_THAT(config->norm.channel_std, ::testing::ElementsAre(0.2470f, 0.2435f, 0.2616f));
  EXPECT_EQ(config->norm.channels(), 3);

  auto refused = [&](const v1::JobSpec& s) {
    absl::StatusOr<TrainConfig> c = TranslateSpec(s, SpecLimits());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(c.status().message());
  };
  v1::JobSpec uneven = spec;
  uneven.mutable_normalization()->add_channel_std(1.0f);
  EXPECT_THAT(refused(uneven), ::testing::HasSubstr("spec.normalization.channel_std"));
  v1::JobSpec zero = spec;
  zero.mutable_normalization()->set_channel_std(1, 0.0f);
  EXPECT_THAT(refused(zero), ::testing::HasSubstr("channel_std[1]"));
  v1::JobSpec both = spec;
  both.mutable_normalization()->set_std(0.5f);
  EXPECT_THAT(refused(both), ::testing::HasSubstr("spec.normalization.mean"));
  v1::JobSpec mlp = testing::SmallSpec("m", 1);
  *mlp.mutable_normalization() = spec.normalization();
  EXPECT_THAT(refused(mlp), ::testing::HasSubstr("3 channels but the model's input is"));
}

TEST(SpecTranslationTest, SetFieldsOverrideThePreset) {
  v1::JobSpec spec;
  spec.set_preset("mnist-mlp");
  spec.set_epochs(2);
  spec.set_batch_size(32);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::KIND_ADAMW);
  spec.mutable_optimizer()->set_lr(0.01f);
  auto config = TranslateSpec(spec, SpecLimits());
  ASSERT_OK(config) << config.status();
  EXPECT_EQ(config->batch_size, 32);
  EXPECT_EQ(config->optimizer.kind, OptimizerConfig::Kind::kAdamW);
  EXPECT_FLOAT_EQ(config->optimizer.lr, 0.01f);
  EXPECT_FLOAT_EQ(config->optimizer.beta1, 0.9f);
}

TEST(SpecTranslationTest, ExplicitModelTranslatesEveryLayerKind) {
  v1::JobSpec spec = testing::SmallSpec("toy", 1);
  v1::ModelSpec* m = spec.mutable_model();
  m->Clear();
  for (int64_t d : {1, 28, 28}) m->add_input_shape(d);
  auto* conv = m->add_layers()->mutable_conv2d();
  conv->set_in_channels(1);
  conv->set_out_channels(4);
  conv->set_padding(1);
  conv->set_bias(false);
  m->add_layers()->mutable_relu();
  m->add_layers()->mutable_maxpool2d();
  m->add_layers()->mutable_flatten();
  m->add_layers()->mutable_dropout()->set_p(0.25f);
  auto* fc = m->add_layers()->mutable_linear();
  fc->set_in_features(4 * 14 * 14);
  fc->set_out_features(10);
  auto config = TranslateSpec(spec, SpecLimits());
  ASSERT_OK(config) << config.status();
  ASSERT_EQ(config->model.layers.size(), 6u);
  const auto& c = std::get<Conv2dConfig>(config->model.layers[0]);
  EXPECT_EQ(c.kernel_size, 3);
  EXPECT_EQ(c.stride, 1);
  EXPECT_FALSE(c.bias);
  EXPECT_EQ(std::get<MaxPool2dConfig>(config->model.layers[2]).kernel_size, 2);
  EXPECT_FLOAT_EQ(std::get<DropoutConfig>(config->model.layers[4]).p, 0.25f);
}

TEST(SpecTranslationTest, CheckpointPolicyDefaultsToCheckpointOnShutdown) {
  EXPECT_TRUE(TranslateCheckpointPolicy(v1::CheckpointPolicy()).on_shutdown);
  v1::CheckpointPolicy off;
  off.set_on_shutdown(false);
  EXPECT_FALSE(TranslateCheckpointPolicy(off).on_shutdown);
}

TEST(SpecTranslationTest, ActivationMemoryOverTheLimitIsRefusedNamingTheFlag) {
  v1::JobSpec spec;
  spec.set_preset("mnist-cnn");
  spec.set_epochs(1);
  SpecLimits limits;
  // The CNN at batch 64: input, 32x26x26, 32x13x13, 64x11x11, 64x5x5, 1600, 128, 10 (and
  // the ReLU outputs), twice (gradients), float32 -- well over 1 MiB.
  limits.max_activation_bytes = 1 << 20;
  auto config = TranslateSpec(spec, limits);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(config.status().message()), ::testing::HasSubstr("a batch of 64 needs"));
  EXPECT_THAT(std::string(config.status().message()),
              ::testing::HasSubstr("over the limit of 1048576 (--max_activation_bytes)"));
  limits.max_activation_bytes = int64_t{1} << 30;
  EXPECT_OK(TranslateSpec(spec, limits));
}

TEST(SpecTranslationTest, ActivationBytesCountsEveryShapeTwiceAndSaturates) {
  EXPECT_EQ(ActivationBytes({{784}, {512}, {10}}, 2), 2 * 2 * 4 * (784 + 512 + 10));
  const int64_t huge = int64_t{1} << 40;
  EXPECT_EQ(ActivationBytes({{huge, huge}}, huge), std::numeric_limits<int64_t>::max());
}

TEST(SpecTranslationTest, HugeInputShapesAreRefusedWithoutOverflow) {
  v1::JobSpec spec;
  spec.set_epochs(1);
  spec.set_batch_size(1);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::KIND_SGD);
  spec.mutable_optimizer()->set_lr(0.1f);
  // Each dimension is within max_features; their product (1e24) overflows int64.
  for (int i = 0; i < 4; ++i) spec.mutable_model()->add_input_shape(1'000'000);
  spec.mutable_model()->add_layers()->mutable_flatten();
  auto config = TranslateSpec(spec, SpecLimits());
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()),
              ::testing::HasSubstr("spec.model.input_shape"));
  EXPECT_THAT(std::string(config.status().message()),
              ::testing::HasSubstr("elements per sample, over the limit of 1000000"));
}

TEST(SpecTranslationTest, NamesAreCheckedForPathTricks) {
  EXPECT_TRUE(IsValidName("mnist"));
  EXPECT_TRUE(IsValidName("fashion-mnist_v1.2"));
  EXPECT_FALSE(IsValidName(""));
  EXPECT_FALSE(IsValidName(".."));
  EXPECT_FALSE(IsValidName("a/b"));
  EXPECT_FALSE(IsValidName(std::string(65, 'a')));
}

}  // namespace
}  // namespace kiln::server
