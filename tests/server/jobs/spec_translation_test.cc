#include "server/jobs/spec_translation.h"

#include <functional>
#include <limits>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/data/augment.h"
#include "engine/model/model.h"
#include "engine/model/sequence_model.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "server/checkpoints/checkpoint_policy.h"
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

TEST(SpecTranslationTest, AGptSpecTranslatesToTheEngineLayersAndAnIterationRun) {
  auto config = TranslateSpec(testing::GptSpec("chars", 65), SpecLimits());
  ASSERT_OK(config) << config.status();
  EXPECT_TRUE(ReadsTokenIds(config->model));
  EXPECT_EQ(config->model.init, InitRule::kGpt2);
  EXPECT_EQ(std::get<LinearConfig>(config->model.layers.back()).tie_weight, "wte");
  const auto& attn = std::get<CausalSelfAttentionConfig>(config->model.layers[3]);
  EXPECT_EQ(attn.n_head, 4);
  EXPECT_TRUE(attn.bias);
  EXPECT_EQ(config->max_iters, 1000);
  EXPECT_EQ(config->eval_interval, 300);
  EXPECT_EQ(config->epochs, 4);  // evaluations at 300, 600, 900 and 1000
  EXPECT_EQ(config->eval_iters, 5);
  EXPECT_EQ(config->grad_accum, 2);
  EXPECT_FLOAT_EQ(config->grad_clip, 1.0f);
  auto shapes = InferShapes(config->model);
  ASSERT_OK(shapes);
  EXPECT_EQ(shapes->back(), (Shape{16, 65}));
}

TEST(SpecTranslationTest, GptSpecErrorsNameTheField) {
  auto error = [](const std::function<void(v1::JobSpec*)>& edit) {
    v1::JobSpec spec = testing::GptSpec("chars", 65);
    edit(&spec);
    auto config = TranslateSpec(spec, SpecLimits());
    return config.ok() ? std::string("ok") : std::string(config.status().message());
  };
  EXPECT_EQ(error([](v1::JobSpec*) {}), "ok");
  EXPECT_EQ(error([](v1::JobSpec* s) {
              s->mutable_model()->mutable_layers(3)->mutable_causal_self_attention()->set_n_head(
                  5);
            }),
            "spec.model.layers[3].causal_self_attention.n_head: 5 heads do not divide n_embd 32");
  EXPECT_EQ(error([](v1::JobSpec* s) { s->set_epochs(3); }),
            "spec.epochs: leave it 0 with spec.max_iters: a language model's run is counted in "
            "iterations");
  EXPECT_EQ(error([](v1::JobSpec* s) { s->set_eval_interval(1001); }),
            "spec.eval_interval: must be in [1, 1000], got 1001");
  EXPECT_EQ(error([](v1::JobSpec* s) {
              s->mutable_model()->mutable_layers(0)->mutable_embedding()->set_num_embeddings(0);
            }),
            "spec.model.layers[0].embedding.num_embeddings: must be in [1, 1000000], got 0");
  // Block size: the input is longer than the position table.
  EXPECT_THAT(error([](v1::JobSpec* s) { s->mutable_model()->set_input_shape(0, 17); }),
              ::testing::HasSubstr("wpe"));
  // Iteration fields belong to language models; epochs to the rest.
  v1::JobSpec mlp;
  mlp.set_preset("mnist-mlp");
  mlp.set_epochs(1);
  mlp.set_eval_interval(10);
  EXPECT_EQ(std::string(TranslateSpec(mlp, SpecLimits()).status().message()),
            "spec.eval_interval: applies to language models, with spec.max_iters");
  mlp.set_eval_interval(0);
  mlp.set_epochs(0);
  mlp.set_max_iters(100);
  EXPECT_EQ(std::string(TranslateSpec(mlp, SpecLimits()).status().message()),
            "spec.max_iters: is for language models (an embedding reading token ids); set epochs "
            "instead");
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

// A spec's optimizer replaces its preset's whole, so optimizer fields without a kind would be
// dropped without a word: they are refused, naming the field.
TEST(SpecTranslationTest, OptimizerFieldsWithoutAKindOverAPresetAreRefused) {
  v1::JobSpec spec;
  spec.set_preset("mnist-cnn");
  spec.set_epochs(1);
  spec.mutable_optimizer()->set_lr(0.01f);
  auto config = TranslateSpec(spec, SpecLimits());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), ::testing::HasSubstr("spec.optimizer.kind"));
  EXPECT_THAT(config.status().message(), ::testing::HasSubstr("replaces the preset's whole"));
  spec.mutable_optimizer()->Clear();  // no optimizer fields: the preset's, as before
  ASSERT_OK(TranslateSpec(spec, SpecLimits()));
}

TEST(SpecTranslationTest, TheResolvedSpecFillsInWhatThePresetSets) {
  v1::JobSpec spec;
  spec.set_preset("mnist-cnn");
  spec.set_epochs(1);
  const v1::JobSpec cnn = ResolvedSpec(spec);
  EXPECT_EQ(cnn.optimizer().kind(), v1::OptimizerSpec::KIND_ADAM);
  EXPECT_FLOAT_EQ(cnn.optimizer().lr(), 0.001f);
  EXPECT_FALSE(cnn.optimizer().has_beta1());  // PyTorch's defaults are left unsaid
  EXPECT_EQ(cnn.batch_size(), 64);
  EXPECT_FLOAT_EQ(cnn.normalization().scale(), 1.0f / 255.0f);
  EXPECT_FLOAT_EQ(cnn.normalization().std(), 1.0f);
  EXPECT_EQ(cnn.preset(), "mnist-cnn");
  EXPECT_EQ(cnn.epochs(), 1);
  EXPECT_EQ(cnn.model().layers_size(), 0);  // the model stays as the spec names it

  // Fields the spec sets stay its own, as TranslateSpec takes them.
  spec.set_preset("mnist-mlp");
  spec.set_batch_size(32);
  const v1::JobSpec mlp = ResolvedSpec(spec);
  EXPECT_EQ(mlp.batch_size(), 32);
  EXPECT_EQ(mlp.optimizer().kind(), v1::OptimizerSpec::KIND_SGD);
  EXPECT_FLOAT_EQ(mlp.optimizer().momentum(), 0.9f);
  EXPECT_FLOAT_EQ(mlp.normalization().mean(), 0.5f);

  // Without a preset only the normalisation has a default; an unknown preset adds nothing.
  const v1::JobSpec own = ResolvedSpec(testing::SmallSpec("toy", 1));
  EXPECT_EQ(own.optimizer().kind(), testing::SmallSpec("toy", 1).optimizer().kind());
  EXPECT_FLOAT_EQ(own.normalization().scale(), 1.0f / 255.0f);
  EXPECT_FLOAT_EQ(own.normalization().std(), 1.0f);
  v1::JobSpec unknown;
  unknown.set_preset("no-such-preset");
  EXPECT_EQ(ResolvedSpec(unknown).optimizer().kind(), v1::OptimizerSpec::KIND_UNSPECIFIED);
  EXPECT_EQ(ResolvedSpec(unknown).batch_size(), 0);
}

TEST(SpecTranslationTest, AResolvedSpecTrainsAsItsPresetDoes) {
  for (const char* name : kPresetNames) {
    v1::JobSpec spec;
    spec.set_preset(name);
    spec.set_epochs(1);
    auto from_preset = TranslateSpec(spec, SpecLimits());
    auto from_resolved = TranslateSpec(ResolvedSpec(spec), SpecLimits());
    ASSERT_OK(from_preset);
    ASSERT_OK(from_resolved);
    EXPECT_EQ(from_resolved->optimizer.kind, from_preset->optimizer.kind) << name;
    EXPECT_EQ(from_resolved->optimizer.lr, from_preset->optimizer.lr) << name;
    EXPECT_EQ(from_resolved->optimizer.momentum, from_preset->optimizer.momentum) << name;
    EXPECT_EQ(from_resolved->optimizer.beta2, from_preset->optimizer.beta2) << name;
    EXPECT_EQ(from_resolved->batch_size, from_preset->batch_size) << name;
    EXPECT_EQ(from_resolved->norm.scale, from_preset->norm.scale) << name;
    EXPECT_EQ(from_resolved->norm.mean, from_preset->norm.mean) << name;
    EXPECT_EQ(from_resolved->norm.std, from_preset->norm.std) << name;
  }
}

TEST(SpecTranslationTest, PrecisionTranslatesWithFp32AsTheDefault) {
  v1::JobSpec spec;
  spec.set_preset("mnist-mlp");
  spec.set_epochs(1);
  auto unset = TranslateSpec(spec, SpecLimits());
  ASSERT_OK(unset) << unset.status();
  EXPECT_EQ(unset->precision, Precision::kFp32);
  EXPECT_EQ(ResolvedSpec(spec).precision(), v1::PRECISION_FP32);  // kilnd's default, said
  spec.set_precision(v1::PRECISION_FP32);
  auto fp32 = TranslateSpec(spec, SpecLimits());
  ASSERT_OK(fp32) << fp32.status();
  EXPECT_EQ(fp32->precision, Precision::kFp32);
  spec.set_precision(v1::PRECISION_TF32);
  auto tf32 = TranslateSpec(spec, SpecLimits());
  ASSERT_OK(tf32) << tf32.status();
  EXPECT_EQ(tf32->precision, Precision::kTf32);
  EXPECT_EQ(ResolvedSpec(spec).precision(), v1::PRECISION_TF32);
  spec.set_precision(v1::PRECISION_BF16);
  auto bf16 = TranslateSpec(spec, SpecLimits());
  ASSERT_OK(bf16) << bf16.status();
  EXPECT_EQ(bf16->precision, Precision::kBf16);
  EXPECT_EQ(ResolvedSpec(spec).precision(), v1::PRECISION_BF16);
}

TEST(SpecTranslationTest, AnUnknownPrecisionIsRefusedNamingTheField) {
  v1::JobSpec spec;
  spec.set_preset("mnist-mlp");
  spec.set_epochs(1);
  spec.set_precision(static_cast<v1::Precision>(7));  // a newer client's value, say
  auto config = TranslateSpec(spec, SpecLimits());
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()),
              ::testing::HasSubstr("spec.precision: unknown precision 7"));
  EXPECT_THAT(std::string(config.status().message()), ::testing::HasSubstr("PRECISION_BF16"));
}

TEST(SpecTranslationTest, OneCycleAndLabelSmoothingTranslateWithPyTorchsDefaults) {
  v1::JobSpec spec;
  spec.set_preset("mnist-mlp");  // SGD momentum 0.9
  spec.set_epochs(2);
  spec.set_label_smoothing(0.1f);
  spec.mutable_schedule()->set_kind(v1::ScheduleSpec::KIND_ONE_CYCLE);
  auto config = TranslateSpec(spec, SpecLimits());
  ASSERT_OK(config) << config.status();
  EXPECT_FLOAT_EQ(config->label_smoothing, 0.1f);
  const LrScheduleConfig& s = config->schedule;
  EXPECT_EQ(s.kind, LrScheduleConfig::Kind::kOneCycle);
  EXPECT_FLOAT_EQ(s.pct_start, 0.3f);
  EXPECT_EQ(s.anneal, LrScheduleConfig::Anneal::kCos);
  EXPECT_FLOAT_EQ(s.div_factor, 25.0f);
  EXPECT_FLOAT_EQ(s.final_div_factor, 1e4f);
  EXPECT_TRUE(s.cycle_momentum);
  EXPECT_FLOAT_EQ(s.base_momentum, 0.85f);
  EXPECT_FLOAT_EQ(s.max_momentum, 0.95f);

  spec.mutable_schedule()->set_anneal(v1::ScheduleSpec::ANNEAL_LINEAR);
  spec.mutable_schedule()->set_pct_start(0.25f);
  spec.mutable_schedule()->set_cycle_momentum(false);
  config = TranslateSpec(spec, SpecLimits());
  ASSERT_OK(config) << config.status();
  EXPECT_EQ(config->schedule.anneal, LrScheduleConfig::Anneal::kLinear);
  EXPECT_FLOAT_EQ(config->schedule.pct_start, 0.25f);
  EXPECT_FALSE(config->schedule.cycle_momentum);
}

TEST(SpecTranslationTest, OneCycleAndLabelSmoothingRejectWhatPyTorchWouldNotRun) {
  struct Case {
    const char* field;
    std::function<void(v1::JobSpec*)> set;
  };
  const Case cases[] = {
      {"spec.label_smoothing", [](v1::JobSpec* s) { s->set_label_smoothing(1.5f); }},
      {"spec.label_smoothing",
       [](v1::JobSpec* s) {
         s->set_label_smoothing(0.1f);
         s->set_loss(v1::LOSS_KIND_MEAN_SQUARED_ERROR);
       }},
      {"spec.schedule.pct_start", [](v1::JobSpec* s) { s->mutable_schedule()->set_pct_start(1); }},
      {"spec.schedule.div_factor",
       [](v1::JobSpec* s) { s->mutable_schedule()->set_div_factor(0.5f); }},
      {"spec.schedule.base_momentum",
       [](v1::JobSpec* s) { s->mutable_schedule()->set_base_momentum(0.99f); }},
      {"spec.schedule.cycle_momentum",
       [](v1::JobSpec* s) { s->mutable_optimizer()->set_momentum(0); }},
  };
  for (const Case& c : cases) {
    v1::JobSpec spec;
    spec.set_preset("mnist-mlp");
    spec.set_epochs(1);
    spec.mutable_schedule()->set_kind(v1::ScheduleSpec::KIND_ONE_CYCLE);
    spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::KIND_SGD);
    spec.mutable_optimizer()->set_lr(0.1f);
    spec.mutable_optimizer()->set_momentum(0.9f);
    c.set(&spec);
    auto config = TranslateSpec(spec, SpecLimits());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(config.status().message().find(c.field), std::string::npos) << config.status();
  }
}

// nanoGPT's recipe as a JSON spec: AdamW decaying only matrices, warm-up then cosine to min_lr.
TEST(SpecTranslationTest, WarmupCosineAndTheMatricesDecayRuleTranslate) {
  v1::JobSpec spec;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  R"({"preset": "mnist-mlp", "epochs": 2,
                      "optimizer": {"kind": "KIND_ADAMW", "lr": 0.001, "weight_decay": 0.1,
                                    "beta2": 0.99, "weight_decay_rule": "WEIGHT_DECAY_RULE_MATRICES"},
                      "schedule": {"kind": "KIND_WARMUP_COSINE", "warmup_iters": 100,
                                   "lr_decay_iters": 5000, "eta_min": 0.0001}})",
                  &spec)
                  .ok());
  auto config = TranslateSpec(spec, SpecLimits());
  ASSERT_OK(config) << config.status();
  EXPECT_EQ(config->optimizer.kind, OptimizerConfig::Kind::kAdamW);
  EXPECT_EQ(config->optimizer.decay_rule, OptimizerConfig::DecayRule::kMatrices);
  const LrScheduleConfig& s = config->schedule;
  EXPECT_EQ(s.kind, LrScheduleConfig::Kind::kWarmupCosine);
  EXPECT_EQ(s.warmup_iters, 100);
  EXPECT_EQ(s.lr_decay_iters, 5000);
  EXPECT_FLOAT_EQ(s.eta_min, 1e-4f);

  // Unset: every parameter decays (today's rule), and the decay runs over the whole run.
  spec.mutable_optimizer()->clear_weight_decay_rule();
  spec.mutable_schedule()->clear_lr_decay_iters();
  config = TranslateSpec(spec, SpecLimits());
  ASSERT_OK(config) << config.status();
  EXPECT_EQ(config->optimizer.decay_rule, OptimizerConfig::DecayRule::kAll);
  EXPECT_EQ(config->schedule.lr_decay_iters, 0);
}

TEST(SpecTranslationTest, WarmupCosineAndTheDecayRuleRejectBadFieldsNamingThem) {
  struct Case {
    const char* field;
    std::function<void(v1::JobSpec*)> set;
  };
  const Case cases[] = {
      {"spec.schedule.warmup_iters",
       [](v1::JobSpec* s) { s->mutable_schedule()->set_warmup_iters(-1); }},
      {"spec.schedule.lr_decay_iters",
       [](v1::JobSpec* s) { s->mutable_schedule()->set_lr_decay_iters(-1); }},
      {"spec.schedule.lr_decay_iters",
       [](v1::JobSpec* s) { s->mutable_schedule()->set_lr_decay_iters(50); }},  // < warm-up
      {"spec.schedule.eta_min", [](v1::JobSpec* s) { s->mutable_schedule()->set_eta_min(-1); }},
      {"spec.schedule.eta_min",
       [](v1::JobSpec* s) { s->mutable_schedule()->set_eta_min(0.01f); }},  // above lr
      {"spec.optimizer.weight_decay_rule",
       [](v1::JobSpec* s) {
         s->mutable_optimizer()->set_weight_decay_rule(
             static_cast<v1::OptimizerSpec::WeightDecayRule>(7));
       }},
  };
  for (const Case& c : cases) {
    v1::JobSpec spec;
    spec.set_preset("mnist-mlp");
    spec.set_epochs(1);
    spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::KIND_ADAMW);
    spec.mutable_optimizer()->set_lr(0.001f);
    spec.mutable_schedule()->set_kind(v1::ScheduleSpec::KIND_WARMUP_COSINE);
    spec.mutable_schedule()->set_warmup_iters(100);
    spec.mutable_schedule()->set_eta_min(1e-4f);
    ASSERT_OK(TranslateSpec(spec, SpecLimits()).status()) << c.field;
    c.set(&spec);
    auto config = TranslateSpec(spec, SpecLimits());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(config.status().message().find(c.field), std::string::npos) << config.status();
  }
}

// Augmentation is off unless asked for; its padding is range-checked here (whether the dataset
// holds images it fits is Submit's check), and the JSON spec file takes it by its field names.
TEST(SpecTranslationTest, AugmentTranslatesAndItsPaddingIsRangeChecked) {
  v1::JobSpec spec = testing::SmallColourSpec("c10", 1);
  auto config = TranslateSpec(spec, SpecLimits());
  ASSERT_OK(config) << config.status();
  EXPECT_FALSE(config->augment.enabled());

  v1::JobSpec from_json;  // JSON parsing replaces the whole message
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  R"({"augment": {"random_crop_padding": 4, "horizontal_flip": true}})", &from_json)
                  .ok());
  spec.MergeFrom(from_json);
  config = TranslateSpec(spec, SpecLimits());
  ASSERT_OK(config) << config.status();
  EXPECT_EQ(config->augment.random_crop_padding, 4);
  EXPECT_TRUE(config->augment.horizontal_flip);

  for (int padding : {-1, kMaxCropPadding + 1}) {
    spec.mutable_augment()->set_random_crop_padding(padding);
    config = TranslateSpec(spec, SpecLimits());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(config.status().message()),
                ::testing::HasSubstr(absl::StrCat("spec.augment.random_crop_padding: must be in "
                                                  "[0, 64], got ",
                                                  padding)));
  }
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

// A CIFAR-style model with every layer type issue 19 added.
v1::JobSpec ColourSpec() {
  v1::JobSpec spec = testing::SmallSpec("toy", 1);
  v1::ModelSpec* m = spec.mutable_model();
  m->Clear();
  for (int64_t d : {3, 32, 32}) m->add_input_shape(d);
  auto* conv = m->add_layers()->mutable_conv2d();
  conv->set_in_channels(3);
  conv->set_out_channels(8);
  conv->set_kernel_size(3);
  conv->set_kernel_w(5);
  conv->set_stride_h(2);
  conv->set_padding(1);
  conv->set_padding_w(2);
  conv->set_bias(false);
  m->add_layers()->mutable_gelu();
  auto* pool = m->add_layers()->mutable_maxpool2d();
  pool->set_kernel_size(3);
  pool->set_stride(2);
  pool->set_padding(1);
  m->add_layers()->mutable_leaky_relu()->set_negative_slope(0.2f);
  auto* avg = m->add_layers()->mutable_avgpool2d();
  avg->set_kernel_size(3);
  avg->set_stride(1);
  avg->set_padding(1);
  m->add_layers()->mutable_silu();
  m->add_layers()->mutable_tanh();
  m->add_layers()->mutable_sigmoid();
  m->add_layers()->mutable_adaptive_avgpool2d();
  m->add_layers()->mutable_flatten();
  auto* fc = m->add_layers()->mutable_linear();
  fc->set_in_features(8);
  fc->set_out_features(10);
  return spec;
}

TEST(SpecTranslationTest, NewLayerTypesAndFieldsTranslate) {
  auto config = TranslateSpec(ColourSpec(), SpecLimits());
  ASSERT_OK(config) << config.status();
  const auto& layers = config->model.layers;
  ASSERT_EQ(layers.size(), 11u);
  const auto& conv = std::get<Conv2dConfig>(layers[0]);
  EXPECT_EQ(conv.KernelH(), 3);
  EXPECT_EQ(conv.KernelW(), 5);
  EXPECT_EQ(conv.StrideH(), 2);
  EXPECT_EQ(conv.StrideW(), 1);
  EXPECT_EQ(conv.PaddingH(), 1);
  EXPECT_EQ(conv.PaddingW(), 2);
  EXPECT_FALSE(conv.stride_w.has_value());  // unset stays unset: the square form applies
  EXPECT_FALSE(conv.bias);
  EXPECT_TRUE(std::holds_alternative<GeluConfig>(layers[1]));
  EXPECT_EQ(std::get<MaxPool2dConfig>(layers[2]).padding, 1);
  EXPECT_FLOAT_EQ(std::get<LeakyReluConfig>(layers[3]).negative_slope, 0.2f);
  const auto& avg = std::get<AvgPool2dConfig>(layers[4]);
  EXPECT_EQ(avg.kernel_size, 3);
  EXPECT_EQ(avg.stride, 1);
  EXPECT_EQ(avg.padding, 1);
  EXPECT_TRUE(std::holds_alternative<SiluConfig>(layers[5]));
  EXPECT_TRUE(std::holds_alternative<TanhConfig>(layers[6]));
  EXPECT_TRUE(std::holds_alternative<SigmoidConfig>(layers[7]));
  const auto& adaptive = std::get<AdaptiveAvgPool2dConfig>(layers[8]);
  EXPECT_EQ(adaptive.output_h, 1);  // 0 on the wire means 1
  EXPECT_EQ(adaptive.output_w, 1);
  // Unset, leaky_relu takes PyTorch's default slope.
  v1::JobSpec spec = ColourSpec();
  spec.mutable_model()->mutable_layers(3)->mutable_leaky_relu()->clear_negative_slope();
  config = TranslateSpec(spec, SpecLimits());
  ASSERT_OK(config) << config.status();
  EXPECT_FLOAT_EQ(std::get<LeakyReluConfig>(config->model.layers[3]).negative_slope, 0.01f);
}

TEST(SpecTranslationTest, NewLayerFieldsOutOfRangeNameTheField) {
  struct Case {
    std::function<void(v1::ModelSpec*)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](v1::ModelSpec* m) { m->mutable_layers(0)->mutable_conv2d()->set_kernel_h(0); },
       "spec.model.layers[0].conv2d.kernel_h: must be in [1, 64], got 0"},
      {[](v1::ModelSpec* m) { m->mutable_layers(0)->mutable_conv2d()->set_stride_w(65); },
       "spec.model.layers[0].conv2d.stride_w: must be in [1, 64], got 65"},
      {[](v1::ModelSpec* m) { m->mutable_layers(0)->mutable_conv2d()->set_padding_w(5); },
       "spec.model.layers[0].conv2d.padding_w: must be in [0, 4], got 5"},
      {[](v1::ModelSpec* m) { m->mutable_layers(0)->mutable_conv2d()->set_padding_h(-1); },
       "spec.model.layers[0].conv2d.padding_h: must be in [0, 2], got -1"},
      // The square padding, checked against a 1-high kernel: named as the spec gave it.
      {[](v1::ModelSpec* m) { m->mutable_layers(0)->mutable_conv2d()->set_kernel_h(1); },
       "spec.model.layers[0].conv2d.padding: must be in [0, 0], got 1"},
      {[](v1::ModelSpec* m) { m->mutable_layers(2)->mutable_maxpool2d()->set_padding(2); },
       "spec.model.layers[2].maxpool2d.padding: must be in [0, 1], got 2"},
      {[](v1::ModelSpec* m) { m->mutable_layers(4)->mutable_avgpool2d()->set_padding(2); },
       "spec.model.layers[4].avgpool2d.padding: must be in [0, 1], got 2"},
      {[](v1::ModelSpec* m) { m->mutable_layers(4)->mutable_avgpool2d()->set_kernel_size(65); },
       "spec.model.layers[4].avgpool2d.kernel_size: must be in [1, 64], got 65"},
      {[](v1::ModelSpec* m) { m->mutable_layers(4)->mutable_avgpool2d()->set_stride(-1); },
       "spec.model.layers[4].avgpool2d.stride: must be in [0, 64], got -1"},
      {[](v1::ModelSpec* m) {
         m->mutable_layers(8)->mutable_adaptive_avgpool2d()->set_output_h(-2);
       },
       "spec.model.layers[8].adaptive_avgpool2d.output_h: must be in [1, 1000000], got -2"},
      {[](v1::ModelSpec* m) {
         m->mutable_layers(3)->mutable_leaky_relu()->set_negative_slope(
             std::numeric_limits<float>::infinity());
       },
       "spec.model.layers[3].leaky_relu.negative_slope: must be finite, got inf"},
      // Shape rules come through spec.model with the layer named.
      {[](v1::ModelSpec* m) {
         m->mutable_layers(8)->mutable_adaptive_avgpool2d()->set_output_h(3);
       },
       "spec.model: layer 8 adaptive_avgpool2d: output size 3x1 does not divide the input 8x16"},
      {[](v1::ModelSpec* m) {
         auto* avg = m->mutable_layers(4)->mutable_avgpool2d();
         avg->set_kernel_size(20);
         avg->set_padding(1);
       },
       "spec.model: layer 4 avgpool2d: kernel_size 20 is larger than the padded input 10x18"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    v1::JobSpec spec = ColourSpec();
    c.edit(spec.mutable_model());
    auto config = TranslateSpec(spec, SpecLimits());
    ASSERT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(config.status().message()), ::testing::HasSubstr(c.message));
  }
}

TEST(SpecTranslationTest, BatchNormLayersTakePyTorchDefaultsAndCheckTheirFields) {
  v1::JobSpec spec = testing::SmallSpec("toy", 1);
  v1::ModelSpec* m = spec.mutable_model();
  m->Clear();
  for (int64_t d : {1, 28, 28}) m->add_input_shape(d);
  auto* conv = m->add_layers()->mutable_conv2d();
  conv->set_in_channels(1);
  conv->set_out_channels(4);
  conv->set_stride(2);
  conv->set_bias(false);
  m->add_layers()->mutable_batchnorm2d()->set_num_features(4);
  m->add_layers()->mutable_relu();
  m->add_layers()->mutable_flatten();
  auto* fc = m->add_layers()->mutable_linear();
  fc->set_in_features(4 * 13 * 13);
  fc->set_out_features(10);
  auto* bn1d = m->add_layers()->mutable_batchnorm1d();
  bn1d->set_num_features(10);
  bn1d->set_eps(1e-3);
  bn1d->set_momentum(0.0);
  bn1d->set_affine(false);
  auto config = TranslateSpec(spec, SpecLimits());
  ASSERT_OK(config) << config.status();
  const auto& a = std::get<BatchNorm2dConfig>(config->model.layers[1]);
  EXPECT_EQ(a.num_features, 4);
  EXPECT_EQ(a.eps, 1e-5);
  EXPECT_EQ(a.momentum, 0.1);
  EXPECT_TRUE(a.affine);
  const auto& b = std::get<BatchNorm1dConfig>(config->model.layers[5]);
  EXPECT_EQ(b.eps, 1e-3);
  EXPECT_EQ(b.momentum, 0.0);
  EXPECT_FALSE(b.affine);

  bn1d->set_momentum(1.5);
  EXPECT_THAT(std::string(TranslateSpec(spec, SpecLimits()).status().message()),
              ::testing::HasSubstr("spec.model.layers[5].batchnorm1d.momentum: must be in [0, 1]"));
  bn1d->set_momentum(0.1);
  bn1d->set_eps(0);
  EXPECT_THAT(std::string(TranslateSpec(spec, SpecLimits()).status().message()),
              ::testing::HasSubstr("spec.model.layers[5].batchnorm1d.eps: must be in (0, 1]"));
  bn1d->clear_eps();
  m->mutable_layers(1)->mutable_batchnorm2d()->set_num_features(3);
  const absl::Status s = TranslateSpec(spec, SpecLimits()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("batchnorm2d: num_features 3 but input is 4x13x13"));
}

// A residual block as the spec writes it: named nodes, inputs, add and concat.
v1::JobSpec ResidualSpec() {
  v1::JobSpec spec = testing::SmallSpec("toy", 1);
  v1::ModelSpec* m = spec.mutable_model();
  m->Clear();
  for (int64_t d : {1, 8, 8}) m->add_input_shape(d);
  auto conv = [&](const char* name, int64_t in, int64_t out, int64_t k, int64_t pad) {
    v1::Layer* l = m->add_layers();
    l->set_name(name);
    auto* c = l->mutable_conv2d();
    c->set_in_channels(in);
    c->set_out_channels(out);
    c->set_kernel_size(k);
    c->set_padding(pad);
    return l;
  };
  conv("stem", 1, 4, 3, 1);
  m->add_layers()->mutable_relu();  // unnamed: "1"
  conv("block.conv1", 4, 4, 3, 1);
  m->add_layers()->mutable_relu();
  conv("block.conv2", 4, 4, 3, 1);
  v1::Layer* add = m->add_layers();
  add->set_name("block.add");
  add->mutable_add();
  add->add_inputs("block.conv2");
  add->add_inputs("1");
  v1::Layer* cat = m->add_layers();
  cat->set_name("cat");
  cat->mutable_concat();
  cat->add_inputs("block.add");
  cat->add_inputs("input");
  m->add_layers()->mutable_flatten();
  auto* fc = m->add_layers()->mutable_linear();
  fc->set_in_features(5 * 8 * 8);
  fc->set_out_features(10);
  return spec;
}

TEST(SpecTranslationTest, GraphSpecKeepsNamesAndInputs) {
  auto config = TranslateSpec(ResidualSpec(), SpecLimits());
  ASSERT_OK(config) << config.status();
  const ModelConfig& m = config->model;
  ASSERT_EQ(m.layers.size(), 9u);
  EXPECT_TRUE(std::holds_alternative<AddConfig>(m.layers[5]));
  EXPECT_TRUE(std::holds_alternative<ConcatConfig>(m.layers[6]));
  EXPECT_EQ(NodeName(m, 0), "stem");
  EXPECT_EQ(NodeName(m, 1), "1");
  EXPECT_EQ(NodeName(m, 5), "block.add");
  EXPECT_EQ(NodeInputs(m, 5), (std::vector<std::string>{"block.conv2", "1"}));
  EXPECT_EQ(NodeInputs(m, 6), (std::vector<std::string>{"block.add", "input"}));
  EXPECT_TRUE(NodeInputs(m, 7).empty());
}

// The README's example, as `kiln submit` reads it (protobuf's JSON mapping).
TEST(SpecTranslationTest, TheReadmesResidualBlockTranslates) {
  const std::string json = R"({"input_shape": [3, 32, 32], "layers": [
    {"name": "conv1", "conv2d": {"in_channels": 3, "out_channels": 16, "padding": 1}},
    {"name": "relu", "relu": {}},
    {"name": "layer1.0.conv1",
     "conv2d": {"in_channels": 16, "out_channels": 32, "stride": 2, "padding": 1}},
    {"name": "layer1.0.relu1", "relu": {}},
    {"name": "layer1.0.conv2", "conv2d": {"in_channels": 32, "out_channels": 32, "padding": 1}},
    {"name": "layer1.0.shortcut", "inputs": ["relu"],
     "conv2d": {"in_channels": 16, "out_channels": 32, "kernel_size": 1, "stride": 2}},
    {"name": "layer1.0.add", "inputs": ["layer1.0.conv2", "layer1.0.shortcut"], "add": {}},
    {"name": "layer1.0.relu2", "relu": {}},
    {"name": "pool", "maxpool2d": {"kernel_size": 16}},
    {"name": "flatten", "flatten": {}},
    {"name": "fc", "linear": {"in_features": 32, "out_features": 10}}]})";
  v1::JobSpec spec = testing::SmallSpec("toy", 1);
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, spec.mutable_model()).ok());
  auto config = TranslateSpec(spec, SpecLimits());
  ASSERT_OK(config) << config.status();
  EXPECT_EQ(config->model.layers.size(), 11u);
  EXPECT_EQ(NodeInputs(config->model, 5), (std::vector<std::string>{"relu"}));
  auto shapes = InferShapes(config->model);
  ASSERT_OK(shapes);
  EXPECT_EQ((*shapes)[7], (Shape{32, 16, 16}));
  EXPECT_EQ(shapes->back(), (Shape{10}));
}

TEST(SpecTranslationTest, GraphErrorsNameTheNode) {
  auto message = [](const v1::JobSpec& spec) {
    auto config = TranslateSpec(spec, SpecLimits());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(config.status().message());
  };
  v1::JobSpec spec = ResidualSpec();
  spec.mutable_model()->mutable_layers(5)->set_inputs(1, "block.conv3");
  EXPECT_EQ(message(spec),
            "spec.model: node block.add: input block.conv3 names no node (inputs "
            "name earlier nodes or \"input\")");
  spec = ResidualSpec();
  spec.mutable_model()->mutable_layers(5)->set_inputs(1, "cat");
  EXPECT_EQ(message(spec),
            "spec.model: node block.add: input cat is layer 6, which comes later "
            "(inputs name earlier nodes, so the graph has no cycles)");
  spec = ResidualSpec();
  spec.mutable_model()->mutable_layers(2)->set_name("stem");
  EXPECT_EQ(message(spec), "spec.model: node stem: the name stem is also layer 0's");
  spec = ResidualSpec();
  spec.mutable_model()->mutable_layers(6)->set_inputs(0, "1");
  EXPECT_EQ(message(spec),
            "spec.model: node block.add: its output is not used (no later node "
            "reads it and only the last node's output is the model's)");
  spec = ResidualSpec();
  spec.mutable_model()->mutable_layers(4)->mutable_conv2d()->set_out_channels(3);
  EXPECT_EQ(message(spec),
            "spec.model: node block.add: inputs block.conv2 is 3x8x8 but 1 is "
            "4x8x8");
  spec = ResidualSpec();
  for (int i = 0; i < 64; ++i) spec.mutable_model()->mutable_layers(6)->add_inputs("input");
  EXPECT_EQ(message(spec), "spec.model.layers[6].inputs: 66 inputs; at most 64");
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

// Moves the strings in: assigning a literal into a map entry trips GCC 12's -Wrestrict.
void SetLabel(v1::JobSpec* spec, std::string key, std::string value) {
  (*spec->mutable_labels())[std::move(key)] = std::move(value);
}

TEST(SpecTranslationTest, AJobNameAndLabelsWithinTheRulesTranslate) {
  v1::JobSpec spec;
  spec.set_preset("mnist-mlp");
  spec.set_epochs(1);
  spec.set_name("baseline run 2: lr/10");
  SetLabel(&spec, "team", "vision");
  SetLabel(&spec, "sweep.id", "2026-12-05_a:3");
  SetLabel(&spec, "tag", "");
  EXPECT_OK(TranslateSpec(spec, SpecLimits()));
}

TEST(SpecTranslationTest, BadJobNamesAndLabelsAreRefusedNamingTheField) {
  const auto refused = [](const std::function<void(v1::JobSpec*)>& change) {
    v1::JobSpec spec;
    spec.set_preset("mnist-mlp");
    spec.set_epochs(1);
    change(&spec);
    absl::Status s = TranslateSpec(spec, SpecLimits()).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    return std::string(s.message());
  };
  using ::testing::HasSubstr;
  EXPECT_THAT(refused([](v1::JobSpec* s) { s->set_name(std::string(65, 'a')); }),
              HasSubstr("spec.name: at most 64 characters, got 65"));
  EXPECT_THAT(refused([](v1::JobSpec* s) { s->set_name("a\nb"); }),
              HasSubstr("spec.name: only letters, digits, spaces"));
  EXPECT_THAT(refused([](v1::JobSpec* s) { s->set_name(" padded"); }),
              HasSubstr("spec.name: must not start or end with a space"));
  EXPECT_THAT(refused([](v1::JobSpec* s) {
                for (int i = 0; i < 33; ++i) SetLabel(s, absl::StrCat("k", i), "v");
              }),
              HasSubstr("spec.labels: at most 32 labels, got 33"));
  EXPECT_THAT(refused([](v1::JobSpec* s) { SetLabel(s, "-team", "x"); }),
              HasSubstr("spec.labels[\"-team\"]: a key is letters, digits"));
  EXPECT_THAT(refused([](v1::JobSpec* s) { SetLabel(s, std::string(64, 'k'), "x"); }),
              HasSubstr("a key has 1..63 characters, got 64"));
  EXPECT_THAT(refused([](v1::JobSpec* s) { SetLabel(s, "team", "a b"); }),
              HasSubstr("spec.labels[\"team\"]: a value is letters, digits"));
  EXPECT_THAT(refused([](v1::JobSpec* s) { SetLabel(s, "team", std::string(129, 'v')); }),
              HasSubstr("a value has at most 128 characters, got 129"));
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
