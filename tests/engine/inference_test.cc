// Inference sessions: loaded from a training checkpoint, they answer what the trained model's
// own forward pass gives, for raw uint8 and [0,1] float inputs alike, batched or one by one.
#include "engine/inference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/backend_registry.h"
#include "engine/model/safetensors.h"
#include "engine/trainer.h"
#include "tests/engine/synthetic_data.h"
#include "tests/engine/test_util.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

class InferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = CreateBackend("cpu", {2});
    ASSERT_OK(b);
    backend_ = std::move(*b);
    TrainConfig c;
    c.model.input_shape = {1, 8, 8};
    c.model.layers = {Conv2dConfig{1, 4, 3}, ReluConfig{}, FlattenConfig{}, LinearConfig{144, 4}};
    c.optimizer.kind = OptimizerConfig::Kind::kAdam;
    c.optimizer.lr = 0.01f;
    c.batch_size = 20;
    c.norm = {1.0f / 255, 0.5f, 0.25f};
    auto t = Trainer::Create(c, backend_.get(), &train_, &test_);
    ASSERT_OK(t) << t.status();
    ASSERT_OK((*t)->Run({}));
    accuracy_ = (*(*t)->Evaluate(test_)).accuracy;
    ASSERT_OK((*t)->SaveCheckpoint(dir_.file("m.safetensors")));
  }

  std::unique_ptr<Backend> backend_;
  Dataset train_ = testing::BandsDataset(200, 4, 8, 1);
  Dataset test_ = testing::BandsDataset(60, 4, 8, 2);
  testing::TempDir dir_;
  double accuracy_ = 0;
};

TEST_F(InferenceTest, ClassesMatchTheTrainedModelsAccuracy) {
  auto s = InferenceSession::FromCheckpoint(dir_.file("m.safetensors"), backend_.get(), 64);
  ASSERT_OK(s) << s.status();
  EXPECT_EQ((*s)->num_classes(), 4);
  EXPECT_EQ((*s)->input_shape(), Shape({1, 8, 8}));
  std::vector<float> probs(60 * 4);
  std::vector<int32_t> classes(60);
  ASSERT_OK((*s)->PredictU8(test_.pixels.data(), 60, probs.data(), classes.data()));
  int hits = 0;
  for (int i = 0; i < 60; ++i) {
    hits += classes[i] == test_.labels[i];
    float sum = 0;
    for (int c = 0; c < 4; ++c) sum += probs[i * 4 + c];
    EXPECT_NEAR(sum, 1.0f, 1e-5);
  }
  EXPECT_DOUBLE_EQ(hits / 60.0, accuracy_);
}

TEST_F(InferenceTest, BatchedAndOneByOneAndFloatInputsAgree) {
  auto s = InferenceSession::FromCheckpoint(dir_.file("m.safetensors"), backend_.get(), 16);
  ASSERT_OK(s);
  std::vector<float> batched(16 * 4), single(4), from_f32(16 * 4);
  std::vector<int32_t> cls(16), one(1), cls_f32(16);
  ASSERT_OK((*s)->PredictU8(test_.pixels.data(), 16, batched.data(), cls.data()));
  std::vector<float> pixels01(16 * 64);
  for (int i = 0; i < 16 * 64; ++i) pixels01[i] = test_.pixels[i] / 255.0f;
  ASSERT_OK((*s)->PredictF32(pixels01.data(), 16, from_f32.data(), cls_f32.data()));
  EXPECT_EQ(cls, cls_f32);
  for (int i = 0; i < 16; ++i) {
    ASSERT_OK((*s)->PredictU8(test_.pixels.data() + i * 64, 1, single.data(), one.data()));
    EXPECT_EQ(one[0], cls[i]);
    for (int c = 0; c < 4; ++c) EXPECT_NEAR(single[c], batched[i * 4 + c], 1e-6);
    for (int c = 0; c < 4; ++c) EXPECT_NEAR(from_f32[i * 4 + c], batched[i * 4 + c], 1e-5);
  }
}

TEST_F(InferenceTest, AMixedBatchIsOnePassAnsweringEachFormAsWhenAlone) {
  auto s = InferenceSession::FromCheckpoint(dir_.file("m.safetensors"), backend_.get(), 16);
  ASSERT_OK(s);
  // Rows 0..5 as uint8, rows 6..15 as [0, 1] floats of other images.
  const uint8_t* u8 = test_.pixels.data();
  std::vector<float> f32(10 * 64);
  for (int i = 0; i < 10 * 64; ++i) f32[i] = test_.pixels[6 * 64 + i] / 255.0f;
  std::vector<float> mixed(16 * 4), alone_u8(6 * 4), alone_f32(10 * 4);
  std::vector<int32_t> mixed_cls(16), cls_u8(6), cls_f32(10);
  ASSERT_OK((*s)->Predict({u8, 6, f32.data(), 10}, mixed.data(), mixed_cls.data()));
  ASSERT_OK((*s)->PredictU8(u8, 6, alone_u8.data(), cls_u8.data()));
  ASSERT_OK((*s)->PredictF32(f32.data(), 10, alone_f32.data(), cls_f32.data()));
  for (int i = 0; i < 16; ++i) {
    const bool is_u8 = i < 6;
    const float* alone = is_u8 ? &alone_u8[i * 4] : &alone_f32[(i - 6) * 4];
    EXPECT_EQ(mixed_cls[i], is_u8 ? cls_u8[i] : cls_f32[i - 6]) << "row " << i;
    for (int c = 0; c < 4; ++c) EXPECT_NEAR(mixed[i * 4 + c], alone[c], 1e-6) << "row " << i;
  }
  // The same images through the other form agree too (x / 255 is what FP32 means).
  std::vector<float> via_u8(10 * 4);
  std::vector<int32_t> via_u8_cls(10);
  ASSERT_OK((*s)->PredictU8(u8 + 6 * 64, 10, via_u8.data(), via_u8_cls.data()));
  EXPECT_EQ(via_u8_cls, cls_f32);
  for (int i = 0; i < 10 * 4; ++i) EXPECT_NEAR(via_u8[i], alone_f32[i], 1e-5);
}

// Weights that are not finite (a diverged or damaged checkpoint) never give an OK answer.
TEST_F(InferenceTest, NonFiniteWeightsAreDataLossNeverAnAnswer) {
  auto contents = ReadSafetensors(dir_.file("m.safetensors"));
  ASSERT_OK(contents);
  HostTensor* weight = nullptr;
  for (HostTensor& t : contents->tensors) {
    if (t.name == "3.weight") weight = &t;
  }
  ASSERT_NE(weight, nullptr);
  const float nan = std::nanf("");
  std::memcpy(weight->bytes.data(), &nan, sizeof(nan));
  ASSERT_OK(WriteSafetensors(dir_.file("nan.safetensors"), contents->tensors, contents->metadata));
  auto s = InferenceSession::FromCheckpoint(dir_.file("nan.safetensors"), backend_.get(), 4);
  ASSERT_OK(s);
  std::vector<float> probs(4 * 4);
  std::vector<int32_t> cls(4);
  const absl::Status status = (*s)->PredictU8(test_.pixels.data(), 4, probs.data(), cls.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(status.message().find("non-finite probability"), absl::string_view::npos) << status;
}

// Finite inputs so large that float32 overflows inside the model are the request's fault, not
// the model's: InvalidArgument naming the sample, while sound weights stay servable.
TEST_F(InferenceTest, InputsThatOverflowTheModelAreInvalidArgumentNotDataLoss) {
  auto s = InferenceSession::FromCheckpoint(dir_.file("m.safetensors"), backend_.get(), 4);
  ASSERT_OK(s);
  const int64_t elems = (*s)->input_elems();
  std::vector<float> x(2 * elems, 0.5f);
  for (int64_t i = elems; i < 2 * elems; ++i) x[i] = 3e38f;  // sample 1
  std::vector<float> probs(2 * 4);
  std::vector<int32_t> cls(2);
  const absl::Status status = (*s)->PredictF32(x.data(), 2, probs.data(), cls.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("sample 1"), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find("too large"), absl::string_view::npos) << status;
  for (int64_t i = elems; i < 2 * elems; ++i) x[i] = 0.5f;
  ASSERT_OK((*s)->PredictF32(x.data(), 2, probs.data(), cls.data()));
}

// 3x4x4 colour samples whose label (0..2) is the brightest channel.
Dataset BrightestChannel(int n, uint32_t seed) {
  Dataset d;
  d.sample_shape = {3, 4, 4};
  d.size = n;
  d.num_classes = 3;
  uint32_t x = seed * 2654435761u + 1;
  for (int i = 0; i < n; ++i) {
    const int label = i % 3;
    d.labels.push_back(label);
    for (int c = 0; c < 3; ++c) {
      for (int j = 0; j < 16; ++j) {
        x = x * 1664525u + 1013904223u;
        d.pixels.push_back(static_cast<uint8_t>((c == label ? 150 : 0) + (x >> 24) % 100));
      }
    }
  }
  return d;
}

TEST(PerChannelInferenceTest, ACheckpointKeepsThePerChannelNormAndServingAppliesIt) {
  auto b = CreateBackend("cpu", {2});
  ASSERT_OK(b);
  const Dataset train = BrightestChannel(150, 1), test = BrightestChannel(60, 2);
  TrainConfig c;
  c.model.input_shape = {3, 4, 4};
  c.model.layers = {FlattenConfig{}, LinearConfig{48, 3}};
  c.optimizer.kind = OptimizerConfig::Kind::kAdam;
  c.optimizer.lr = 0.01f;
  c.batch_size = 16;
  c.epochs = 3;
  // Channel means far apart, so serving with the scalar norm would not answer the same.
  c.norm.channel_mean = {0.9f, 0.1f, 0.5f};
  c.norm.channel_std = {0.2f, 0.3f, 0.05f};
  auto t = Trainer::Create(c, b->get(), &train, &test);
  ASSERT_OK(t);
  ASSERT_OK((*t)->Run({}));
  const double accuracy = (*(*t)->Evaluate(test)).accuracy;
  EXPECT_GT(accuracy, 0.9);
  testing::TempDir dir;
  ASSERT_OK((*t)->SaveCheckpoint(dir.file("c.safetensors")));
  auto s = InferenceSession::FromCheckpoint(dir.file("c.safetensors"), b->get(), 60);
  ASSERT_OK(s);
  EXPECT_EQ((*s)->norm().channel_mean, c.norm.channel_mean);
  EXPECT_EQ((*s)->norm().channel_std, c.norm.channel_std);
  std::vector<float> probs(60 * 3);
  std::vector<int32_t> cls(60);
  ASSERT_OK((*s)->PredictU8(test.pixels.data(), 60, probs.data(), cls.data()));
  int hits = 0;
  for (int i = 0; i < 60; ++i) hits += cls[i] == test.labels[i];
  EXPECT_DOUBLE_EQ(hits / 60.0, accuracy);

  // A per-channel norm whose channels do not divide the input is refused before training.
  TrainConfig bad = c;
  bad.norm.channel_mean = {0, 0, 0, 0, 0};
  bad.norm.channel_std = {1, 1, 1, 1, 1};
  EXPECT_EQ(Trainer::Create(bad, b->get(), &train, &test).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad.norm.channel_mean = {0, 0, 0};
  bad.norm.channel_std = {1, 0, 1};
  EXPECT_EQ(Trainer::Create(bad, b->get(), &train, &test).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(InferenceTest, BadRequestsAreErrors) {
  auto s = InferenceSession::FromCheckpoint(dir_.file("m.safetensors"), backend_.get(), 8);
  ASSERT_OK(s);
  std::vector<float> probs(9 * 4);
  std::vector<int32_t> cls(9);
  EXPECT_NE((*s)->PredictU8(test_.pixels.data(), 9, probs.data(), cls.data())
                .message()
                .find("batch 9 is outside 1..8"),
            std::string::npos);
  std::vector<float> bad(64, 0.5f);
  bad[3] = std::nanf("");
  EXPECT_EQ((*s)->PredictF32(bad.data(), 1, probs.data(), cls.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_NE((*s)->Predict({test_.pixels.data(), 5, bad.data(), 4}, probs.data(), cls.data())
                .message()
                .find("batch 9 is outside 1..8"),
            std::string::npos);
  EXPECT_EQ(InferenceSession::FromCheckpoint(dir_.file("none"), backend_.get(), 8).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kiln
