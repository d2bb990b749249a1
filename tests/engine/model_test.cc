// Model building: shape inference, the errors for wrong shapes, parameter names and counts.
#include "engine/model/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/backend_registry.h"
#include "engine/model/model_config_json.h"
#include "tests/engine/test_util.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

std::string ShapeError(const ModelConfig& c) {
  auto s = InferShapes(c);
  EXPECT_FALSE(s.ok());
  return std::string(s.status().message());
}

TEST(InferShapes, ReferenceModels) {
  auto mlp = InferShapes(MnistMlpConfig());
  ASSERT_OK(mlp);
  EXPECT_EQ(mlp->back(), Shape({10}));
  auto cnn = InferShapes(MnistCnnConfig());
  ASSERT_OK(cnn);
  EXPECT_EQ((*cnn)[1], Shape({32, 26, 26}));
  EXPECT_EQ((*cnn)[3], Shape({32, 13, 13}));
  EXPECT_EQ((*cnn)[6], Shape({64, 5, 5}));
  EXPECT_EQ(cnn->back(), Shape({10}));
  EXPECT_EQ(CountParameters(MnistMlpConfig()), 535818);
  EXPECT_EQ(CountParameters(MnistCnnConfig()), 225034);
}

TEST(InferShapes, WrongLinearInputNamesLayerAndBothShapes) {
  ModelConfig c = MnistCnnConfig();
  c.layers.erase(c.layers.begin() + 6);  // drop the flatten: linear sees 64x5x5 directly
  std::get<LinearConfig>(c.layers[6]).in_features = 1024;
  EXPECT_EQ(ShapeError(c), "layer 6 linear: in_features 1024 but input is 64x5x5 = 1600");
}

TEST(InferShapes, ErrorsNameTheProblem) {
  ModelConfig c{{1, 28, 28}, {Conv2dConfig{3, 8, 3}}};
  EXPECT_EQ(ShapeError(c), "layer 0 conv2d: in_channels 3 but input is 1x28x28 (1 channels)");
  c = {{784}, {Conv2dConfig{1, 8, 3}}};
  EXPECT_EQ(ShapeError(c), "layer 0 conv2d: conv2d needs a CxHxW input but input is 784");
  c = {{1, 4, 4}, {Conv2dConfig{1, 8, 5}}};
  EXPECT_EQ(ShapeError(c), "layer 0 conv2d: kernel_size 5 is larger than the padded input 4x4");
  c = {{1, 4, 4}, {MaxPool2dConfig{5}}};
  EXPECT_EQ(ShapeError(c), "layer 0 maxpool2d: kernel_size 5 is larger than the input 1x4x4");
  c = {{10}, {LinearConfig{10, 0}}};
  EXPECT_EQ(ShapeError(c), "layer 0 linear: out_features must be positive, got 0");
  c = {{10}, {DropoutConfig{1.0f}}};
  EXPECT_EQ(ShapeError(c), "layer 0 dropout: p must be in [0, 1), got 1");
  c = {{10}, {}};
  EXPECT_EQ(ShapeError(c), "model has no layers");
  c = {{0, 3}, {ReluConfig{}}};
  EXPECT_EQ(ShapeError(c), "model input_shape 0x3 has a non-positive dimension");
  c = {{2, 3, 3}, {SoftmaxConfig{}}};
  EXPECT_EQ(ShapeError(c),
            "layer 0 softmax: needs a flat input but input is 2x3x3 (add a flatten layer)");
}

TEST(InferShapes, PoolingAndActivationErrorsNameTheLayerAndTheProblem) {
  auto one = [](Shape in, LayerConfig layer) { return ModelConfig{std::move(in), {layer}}; };
  EXPECT_EQ(ShapeError(one({1, 4, 4}, AvgPool2dConfig{5})),
            "layer 0 avgpool2d: kernel_size 5 is larger than the input 1x4x4");
  EXPECT_EQ(ShapeError(one({1, 3, 3}, AvgPool2dConfig{2, 1, 2})),
            "layer 0 avgpool2d: padding 2 is more than half of kernel_size 2");
  EXPECT_EQ(ShapeError(one({1, 2, 2}, AvgPool2dConfig{5, 1, 1})),
            "layer 0 avgpool2d: kernel_size 5 is larger than the padded input 4x4");
  EXPECT_EQ(ShapeError(one({1, 8, 8}, MaxPool2dConfig{3, 1, 2})),
            "layer 0 maxpool2d: padding 2 is more than half of kernel_size 3");
  EXPECT_EQ(ShapeError(one({1, 8, 8}, MaxPool2dConfig{2, 2, -1})),
            "layer 0 maxpool2d: padding must be >= 0, got -1");
  EXPECT_EQ(ShapeError(one({64}, AvgPool2dConfig{2})),
            "layer 0 avgpool2d: avgpool2d needs a CxHxW input but input is 64");
  EXPECT_EQ(ShapeError(one({3, 5, 5}, AdaptiveAvgPool2dConfig{2, 2})),
            "layer 0 adaptive_avgpool2d: output size 2x2 does not divide the input 5x5 evenly; "
            "only output sizes whose sides divide the input's are supported (1x1, global average "
            "pooling, always does)");
  EXPECT_EQ(ShapeError(one({3, 5, 5}, AdaptiveAvgPool2dConfig{0, 1})),
            "layer 0 adaptive_avgpool2d: output_h must be positive, got 0");
  EXPECT_EQ(ShapeError(one({10}, LeakyReluConfig{std::nanf("")})),
            "layer 0 leaky_relu: negative_slope must be finite, got nan");
  Conv2dConfig conv{1, 4, 3};
  conv.kernel_w = 7;
  EXPECT_EQ(ShapeError(one({1, 8, 6}, conv)),
            "layer 0 conv2d: kernel 3x7 is larger than the padded input 8x6");
  conv.padding_w = 1;
  auto ok = InferShapes(one({1, 8, 6}, conv));
  ASSERT_OK(ok);
  EXPECT_EQ(ok->back(), (Shape{4, 6, 2}));
  conv.stride_h = 0;
  EXPECT_EQ(ShapeError(one({1, 8, 6}, conv)), "layer 0 conv2d: stride_h must be positive, got 0");
  conv.stride_h = 2;
  conv.padding_h = -2;
  EXPECT_EQ(ShapeError(one({1, 8, 6}, conv)), "layer 0 conv2d: padding_h must be >= 0, got -2");
}

TEST(InferShapes, NewLayersShapesAndParameterCounts) {
  Conv2dConfig conv{3, 8, 3, 1, 1, false};
  conv.kernel_h = 1;
  conv.stride_w = 2;
  conv.padding_h = 0;
  // H: (9 - 1) / 1 + 1 = 9; W: (10 + 2 - 3) / 2 + 1 = 5.
  const ModelConfig c{{3, 9, 10},
                      {conv, GeluConfig{}, MaxPool2dConfig{3, 2, 1}, AvgPool2dConfig{2, 1},
                       AdaptiveAvgPool2dConfig{}, FlattenConfig{}, TanhConfig{}, SigmoidConfig{},
                       LeakyReluConfig{}, SiluConfig{}}};
  auto shapes = InferShapes(c);
  ASSERT_OK(shapes) << shapes.status();
  EXPECT_EQ((*shapes)[1], (Shape{8, 9, 5}));
  EXPECT_EQ((*shapes)[3], (Shape{8, 5, 3}));  // (9 + 2 - 3) / 2 + 1, (5 + 2 - 3) / 2 + 1
  EXPECT_EQ((*shapes)[4], (Shape{8, 4, 2}));
  EXPECT_EQ((*shapes)[5], (Shape{8, 1, 1}));
  EXPECT_EQ(shapes->back(), (Shape{8}));
  EXPECT_EQ(CountParameters(c), 8 * 3 * 1 * 3);  // no bias
  EXPECT_STREQ(LayerTypeName(AdaptiveAvgPool2dConfig{}), "adaptive_avgpool2d");
  EXPECT_STREQ(LayerTypeName(LeakyReluConfig{}), "leaky_relu");
}

TEST(Model, BuildsAndTrainsAStepWithEveryNewLayer) {
  auto backend = CreateBackend("cpu", {1});
  ASSERT_OK(backend);
  Conv2dConfig conv{3, 4, 3, 1, 1};
  conv.kernel_w = 5;
  conv.padding_w = 2;
  const ModelConfig c{{3, 8, 8},
                      {conv, LeakyReluConfig{0.1f}, MaxPool2dConfig{3, 2, 1}, GeluConfig{},
                       AvgPool2dConfig{3, 1, 1}, SiluConfig{}, AdaptiveAvgPool2dConfig{},
                       FlattenConfig{}, TanhConfig{}, LinearConfig{4, 3}, SigmoidConfig{}}};
  auto model = Model::Build(c, backend->get(), 1);
  ASSERT_OK(model) << model.status();
  Tensor x = testing::MakeTensor(**backend, {2, 3, 8, 8}, testing::RandomValues(2 * 3 * 64, 3));
  auto out = (*model)->Forward(x, Mode::kTrain);
  ASSERT_OK(out) << out.status();
  const std::vector<float> y = testing::ToHost(**backend, **out);
  ASSERT_EQ(y.size(), 6u);
  for (float v : y) {
    EXPECT_GT(v, 0.0f);  // a sigmoid's output
    EXPECT_LT(v, 1.0f);
  }
}

TEST(Model, ParameterNamesFollowTorchSequential) {
  auto backend = CreateBackend("cpu", {1});
  ASSERT_OK(backend);
  auto model = Model::Build(MnistCnnConfig(), backend->get(), 0);
  ASSERT_OK(model);
  std::vector<std::string> names;
  for (const auto& p : (*model)->parameters()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "3.weight", "3.bias", "7.weight",
                                             "7.bias", "9.weight", "9.bias"}));
}

TEST(Model, InitialisationIsSeededAndBoundedAsPyTorch) {
  auto backend = CreateBackend("cpu", {1});
  ASSERT_OK(backend);
  auto a = Model::Build(MnistMlpConfig(), backend->get(), 5);
  auto b = Model::Build(MnistMlpConfig(), backend->get(), 5);
  auto c = Model::Build(MnistMlpConfig(), backend->get(), 6);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  auto wa = testing::ToHost(**backend, (*a)->parameters()[0].param->value);
  auto wb = testing::ToHost(**backend, (*b)->parameters()[0].param->value);
  auto wc = testing::ToHost(**backend, (*c)->parameters()[0].param->value);
  EXPECT_EQ(wa, wb);
  EXPECT_NE(wa, wc);
  // kaiming-uniform(a=sqrt(5)) on fan_in 784: U(-1/28, 1/28); the spread fills the bound.
  float lo = 1, hi = -1;
  for (float v : wa) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_GE(lo, -1.0f / 28);
  EXPECT_LE(hi, 1.0f / 28);
  EXPECT_LT(lo, -0.99f / 28);
  EXPECT_GT(hi, 0.99f / 28);
}

TEST(Model, ForwardRejectsWrongInputShape) {
  auto backend = CreateBackend("cpu", {1});
  auto model = Model::Build(MnistMlpConfig(), backend->get(), 0);
  ASSERT_OK(model);
  Tensor x = testing::MakeTensor(**backend, {2, 100}, std::vector<float>(200, 0));
  auto out = (*model)->Forward(x, Mode::kEval);
  EXPECT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("expects batch x 784"), std::string::npos);
}

TEST(ModelConfigJson, RoundTripsAndRejectsUnknownLayers) {
  const ModelConfig cnn = MnistCnnConfig();
  auto back = ModelConfigFromJson(ModelConfigToJson(cnn));
  ASSERT_OK(back) << back.status();
  EXPECT_EQ(ModelConfigToJson(*back), ModelConfigToJson(cnn));
  auto bad = ModelConfigFromJson(R"({"input_shape":[4],"layers":[{"type":"lstm"}]})");
  EXPECT_NE(bad.status().message().find("layer 0 lstm: unknown layer type"), std::string::npos);
  auto bad_field =
      ModelConfigFromJson(R"({"input_shape":[4],"layers":[{"type":"linear","in_features":"4"}]})");
  EXPECT_NE(bad_field.status().message().find("in_features must be an integer"), std::string::npos);
  EXPECT_FALSE(ModelConfigFromJson("{").ok());
}

TEST(ModelConfigJson, RoundTripsEveryNewLayerAndField) {
  Conv2dConfig conv{3, 4, 3, 1, 1, false};
  conv.kernel_h = 1;
  conv.kernel_w = 5;
  conv.stride_h = 2;
  conv.stride_w = 1;
  conv.padding_h = 0;
  conv.padding_w = 2;
  const ModelConfig c{
      {3, 8, 8},
      {conv, MaxPool2dConfig{3, 2, 1}, AvgPool2dConfig{3, 1, 1}, AdaptiveAvgPool2dConfig{2, 4},
       TanhConfig{}, SigmoidConfig{}, GeluConfig{}, LeakyReluConfig{0.25f}, SiluConfig{}}};
  const std::string text = ModelConfigToJson(c);
  auto back = ModelConfigFromJson(text);
  ASSERT_OK(back) << back.status();
  EXPECT_EQ(ModelConfigToJson(*back), text);
  ASSERT_EQ(back->layers.size(), c.layers.size());
  const auto& conv_back = std::get<Conv2dConfig>(back->layers[0]);
  EXPECT_EQ(conv_back.KernelH(), 1);
  EXPECT_EQ(conv_back.KernelW(), 5);
  EXPECT_EQ(conv_back.StrideH(), 2);
  EXPECT_EQ(conv_back.StrideW(), 1);
  EXPECT_EQ(conv_back.padding_h, 0);  // set to 0, not unset
  EXPECT_EQ(conv_back.PaddingW(), 2);
  EXPECT_FALSE(conv_back.bias);
  EXPECT_EQ(std::get<MaxPool2dConfig>(back->layers[1]).padding, 1);
  EXPECT_EQ(std::get<AvgPool2dConfig>(back->layers[2]).kernel_size, 3);
  EXPECT_EQ(std::get<AvgPool2dConfig>(back->layers[2]).padding, 1);
  EXPECT_EQ(std::get<AdaptiveAvgPool2dConfig>(back->layers[3]).output_w, 4);
  EXPECT_FLOAT_EQ(std::get<LeakyReluConfig>(back->layers[7]).negative_slope, 0.25f);
  // A square conv writes no per-axis field; older checkpoints (no padding on maxpool2d) still
  // read, with the defaults.
  EXPECT_EQ(ModelConfigToJson({{1, 4, 4}, {Conv2dConfig{1, 2, 3}}}).find("kernel_h"),
            std::string::npos);
  auto old = ModelConfigFromJson(
      R"({"input_shape":[1,4,4],"layers":[{"type":"maxpool2d","kernel_size":2,"stride":0},)"
      R"({"type":"leaky_relu"}]})");
  ASSERT_OK(old) << old.status();
  EXPECT_EQ(std::get<MaxPool2dConfig>(old->layers[0]).padding, 0);
  EXPECT_FLOAT_EQ(std::get<LeakyReluConfig>(old->layers[1]).negative_slope, 0.01f);
  auto bad = ModelConfigFromJson(
      R"({"input_shape":[4],"layers":[{"type":"leaky_relu","negative_slope":"x"}]})");
  EXPECT_NE(bad.status().message().find("layer 0 leaky_relu: negative_slope must be a number"),
            std::string::npos);
  auto bad_axis =
      ModelConfigFromJson(R"({"input_shape":[1,4,4],"layers":[{"type":"conv2d","kernel_h":1.5}]})");
  EXPECT_NE(bad_axis.status().message().find("layer 0 conv2d: kernel_h must be an integer"),
            std::string::npos);
}

TEST(BackendRegistry, DeviceStrings) {
  EXPECT_OK(ValidateDevice("cpu"));
  EXPECT_OK(ValidateDevice("auto"));
  EXPECT_EQ(ValidateDevice("gpu").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateDevice("cuda:x").code(), absl::StatusCode::kInvalidArgument);
  auto auto_backend = CreateBackend("auto");
  ASSERT_OK(auto_backend);
  if (AvailableDevices().size() == 1) {
    EXPECT_EQ((*auto_backend)->name(), "cpu");
    auto missing = CreateBackend("cuda:0");
    EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
    EXPECT_NE(missing.status().message().find("cuda:0 not found"), std::string::npos);
  }
}

// The engine writes no log lines of its own: kilnd's --log_format json promises that every line
// on its stderr is JSON, and it says which devices it found (and why not CUDA) in its own event.
TEST(BackendRegistry, AutoDeviceWritesNothingAndSaysWhyNoCudaOnRequest) {
  ::testing::internal::CaptureStderr();
  ASSERT_OK(CreateBackend("auto"));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  if (AvailableDevices().size() == 1) {
    EXPECT_FALSE(NoCudaDeviceReason().empty());
  } else {
    EXPECT_EQ(NoCudaDeviceReason(), "");
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// A ReLU fused into the preceding conv2d gives exactly the unfused outputs and gradients.
// Equal where the fused layers run the same kernels in the same order (`tolerance` 0), else
// within `tolerance` relative (of at least 1).
void ExpectNear(const std::vector<float>& a, const std::vector<float>& b, double tolerance) {
  if (tolerance == 0) {
    EXPECT_EQ(a, b);
    return;
  }
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], tolerance * std::max(1.0, std::abs(double{b[i]}))) << "at " << i;
  }
}

void ExpectFusedMatchesSeparate(const ModelConfig& c, int batch, double tolerance = 0,
                                Precision precision = Precision::kFp32) {
  BackendOptions options;
  options.threads = 2;
  options.precision = precision;
  auto backend = CreateBackend("cpu", options);
  ASSERT_OK(backend);
  auto fused = Model::Build(c, backend->get(), 1, Fusion::kFuse);
  auto plain = Model::Build(c, backend->get(), 1, Fusion::kNone);
  ASSERT_TRUE(fused.ok() && plain.ok());
  Shape in = c.input_shape;
  in.insert(in.begin(), batch);
  const int64_t classes = (*fused)->output_shape()[0];
  Tensor x = testing::MakeTensor(**backend, in, testing::RandomValues(NumElements(in), 4));
  Tensor dout =
      testing::MakeTensor(**backend, {batch, classes}, testing::RandomValues(batch * classes, 5));
  std::vector<std::vector<float>> grads[2];
  std::vector<float> outs[2];
  int k = 0;
  for (auto* m : {fused->get(), plain->get()}) {
    auto y = m->Forward(x, Mode::kTrain);
    ASSERT_OK(y);
    outs[k] = testing::ToHost(**backend, **y);
    ASSERT_OK(m->ZeroGrad());
    ASSERT_OK(m->Backward(dout));
    for (const auto& p : m->parameters())
      grads[k].push_back(testing::ToHost(**backend, p.param->grad));
    ++k;
  }
  ExpectNear(outs[0], outs[1], tolerance);
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) ExpectNear(grads[0][i], grads[1][i], tolerance);
}

TEST(Model, FusedConvReluMatchesSeparateLayers) {
  ExpectFusedMatchesSeparate(
      {{2, 9, 9},
       {Conv2dConfig{2, 4, 3, 1, 1}, ReluConfig{}, MaxPool2dConfig{2}, Conv2dConfig{4, 3, 3},
        ReluConfig{}, FlattenConfig{}, LinearConfig{12, 5}}},
      3);
}

// One input channel, as the reference CNN's first layer: with its max pooling fused, that runs
// as im2col in window order (sums in another order than oneDNN's forward: near, not equal).
TEST(Model, FusedConvReluMatchesSeparateLayersForOneInputChannel) {
  ExpectFusedMatchesSeparate({{1, 10, 10},
                              {Conv2dConfig{1, 4, 3, 1, 1}, ReluConfig{}, MaxPool2dConfig{2},
                               FlattenConfig{}, LinearConfig{100, 5}}},
                             3, 1e-5);
}

// The im2col path with an input gradient (a conv2d of one input channel that is not the first
// layer), stride 2, padding and 3x3 windows that leave a row and a column out (7 -> 2).
TEST(Model, FusedMaxPoolOnOneInputChannelWithStridePaddingAndInputGradient) {
  ExpectFusedMatchesSeparate(
      {{1, 13, 13},
       {Conv2dConfig{1, 1, 3, 1, 1}, ReluConfig{}, Conv2dConfig{1, 6, 3, 2, 1}, ReluConfig{},
        MaxPool2dConfig{3}, FlattenConfig{}, LinearConfig{24, 4}}},
      3, 1e-5);
}

// The CPU backend fuses a max pooling of non-overlapping windows into the conv2d (and ReLU)
// before it, keeping the convolution's output in oneDNN's blocked layout where it has one
// (channels a multiple of 16): the reference CNN's layers, with odd sizes that leave rows and
// columns outside every window (26 -> 13, 11 -> 5).
TEST(Model, FusedMaxPoolMatchesSeparateLayersOnTheReferenceCnn) {
  const ModelConfig c{
      {1, 28, 28},
      {Conv2dConfig{1, 32, 3}, ReluConfig{}, MaxPool2dConfig{2}, Conv2dConfig{32, 64, 3},
       ReluConfig{}, MaxPool2dConfig{2}, FlattenConfig{}, LinearConfig{1600, 10}}};
  auto backend = CreateBackend("cpu", {2});
  ASSERT_OK(backend);
  auto model = Model::Build(c, backend->get(), 1);
  ASSERT_OK(model);
  EXPECT_TRUE((*model)->layer_fused(1));   // relu1 into conv1
  EXPECT_TRUE((*model)->layer_fused(2));   // pool1 into conv1
  EXPECT_TRUE((*model)->layer_fused(5));   // pool2 into conv2
  ExpectFusedMatchesSeparate(c, 3, 1e-5);  // conv1: im2col in window order
  // conv2 alone (32 input channels: oneDNN's blocks both ways) gives exactly the same values.
  ExpectFusedMatchesSeparate({{32, 13, 13},
                              {Conv2dConfig{32, 64, 3}, ReluConfig{}, MaxPool2dConfig{2},
                               FlattenConfig{}, LinearConfig{1600, 10}}},
                             3);
}

// Without a ReLU between them, with 3x3 windows, and with channels in several blocks of 16.
TEST(Model, FusedMaxPoolMatchesSeparateLayersWithoutReluAndWiderWindows) {
  ExpectFusedMatchesSeparate(
      {{3, 11, 11},
       {Conv2dConfig{3, 32, 3, 1, 1}, MaxPool2dConfig{3}, FlattenConfig{}, LinearConfig{288, 5}}},
      4);
}

// In bf16 the fused layers write the masked gradient straight into the convolution's bfloat16
// blocks, rounding as the separate layers' reorder does: the same values exactly, with a ReLU
// alone (its mask applied while blocking), with a max pooling, and with both.
TEST(Model, FusedLayersMatchSeparateLayersInBf16) {
  const ModelConfig relu{
      {32, 13, 13},
      {Conv2dConfig{32, 64, 3}, ReluConfig{}, FlattenConfig{}, LinearConfig{64 * 11 * 11, 10}}};
  const ModelConfig pool{
      {32, 13, 13},
      {Conv2dConfig{32, 64, 3}, MaxPool2dConfig{2}, FlattenConfig{}, LinearConfig{1600, 10}}};
  const ModelConfig both{{32, 13, 13},
                         {Conv2dConfig{32, 64, 3}, ReluConfig{}, MaxPool2dConfig{2},
                          FlattenConfig{}, LinearConfig{1600, 10}}};
  for (const ModelConfig* c : {&relu, &pool, &both}) {
    ExpectFusedMatchesSeparate(*c, 3, 0, Precision::kBf16);
  }
}

BatchNorm2dConfig BatchNormOf(int64_t features) {
  BatchNorm2dConfig c;
  c.num_features = features;
  return c;
}

// The ResNet example's shape at 8x8: a 3-channel stem, an identity block of 16 channels and a
// downsampling block to 32 with a 1x1 projection, global average pooling, a classifier.
ModelConfig ResidualBlocks() {
  ModelConfig c;
  c.input_shape = {3, 8, 8};
  // clang-format off
  c.layers = {Conv2dConfig{3, 16, 3, 1, 1}, BatchNormOf(16), ReluConfig{},
              Conv2dConfig{16, 16, 3, 1, 1}, BatchNormOf(16), ReluConfig{},
              Conv2dConfig{16, 16, 3, 1, 1}, BatchNormOf(16), AddConfig{}, ReluConfig{},
              Conv2dConfig{16, 32, 3, 2, 1}, BatchNormOf(32), ReluConfig{},
              Conv2dConfig{32, 32, 3, 1, 1}, BatchNormOf(32),
              Conv2dConfig{16, 32, 1, 2, 0}, BatchNormOf(32), AddConfig{}, ReluConfig{},
              AdaptiveAvgPool2dConfig{1, 1}, FlattenConfig{}, LinearConfig{32, 5}};
  c.names = {"conv1", "bn1", "relu", "l1.conv1", "l1.bn1", "l1.relu1", "l1.conv2", "l1.bn2",
             "l1.add", "l1.relu2", "l2.conv1", "l2.bn1", "l2.relu1", "l2.conv2", "l2.bn2",
             "l2.short", "l2.short_bn", "l2.add", "l2.relu2", "pool", "flatten", "fc"};
  // clang-format on
  c.inputs.resize(c.layers.size());
  c.inputs[8] = {"l1.bn2", "relu"};
  c.inputs[15] = {"l1.relu2"};
  c.inputs[17] = {"l2.bn2", "l2.short_bn"};
  return c;
}

// On the CPU the images between the convolutions of residual blocks stay in nChw16c: every
// value from the stem's output to the last ReLU; the pooled one-pixel output and the classifier
// are NCHW. The results are those of the separate NCHW layers (batch norm's sums in another
// order: within 1e-5), and repeat bit for bit.
TEST(Model, ResidualBlocksKeepImagesInNchw16cAndMatchNchwLayers) {
  const ModelConfig c = ResidualBlocks();
  auto backend = CreateBackend("cpu", {2});
  ASSERT_OK(backend);
  auto model = Model::Build(c, backend->get(), 1);
  ASSERT_OK(model);
  for (size_t i = 0; i < c.layers.size(); ++i) {
    const ImageLayout want = i < 19 ? ImageLayout::kNchw16c : ImageLayout::kNchw;
    EXPECT_EQ((*model)->output_layout(i), want) << (*model)->node_name(i);
  }
  // The ReLUs that alone read a batch norm's output run inside it; those after an add do not.
  for (size_t i : {2, 5, 12}) EXPECT_TRUE((*model)->layer_fused(i)) << (*model)->node_name(i);
  for (size_t i : {9, 18}) EXPECT_FALSE((*model)->layer_fused(i)) << (*model)->node_name(i);
  // An add's inputs that only it reads take its output gradient's tensor (l1.bn2, l2.bn2,
  // l2.short_bn); the stem's ReLU, read by l1.conv1 too, gets a gradient of its own.
  for (size_t i = 0; i < c.layers.size(); ++i) {
    EXPECT_EQ((*model)->output_grad_shared(i), i == 7 || i == 14 || i == 16)
        << (*model)->node_name(i);
  }
  auto separate = Model::Build(c, backend->get(), 1, Fusion::kNone);
  ASSERT_OK(separate);
  for (size_t i = 0; i < c.layers.size(); ++i) {
    EXPECT_EQ((*separate)->output_layout(i), ImageLayout::kNchw) << (*separate)->node_name(i);
  }
  ExpectFusedMatchesSeparate(c, 4, 1e-5);
  ExpectFusedMatchesSeparate(c, 4, 1e-5, Precision::kBf16);
  // Twice the same pass: the same bits.
  Tensor x = testing::MakeTensor(**backend, {4, 3, 8, 8}, testing::RandomValues(4 * 192, 9));
  Tensor dout = testing::MakeTensor(**backend, {4, 5}, testing::RandomValues(20, 10));
  std::vector<float> runs[2];
  for (auto& run : runs) {
    auto y = (*model)->Forward(x, Mode::kTrain);
    ASSERT_OK(y);
    run = testing::ToHost(**backend, **y);
    ASSERT_OK((*model)->ZeroGrad());
    ASSERT_OK((*model)->Backward(dout));
    for (const auto& p : (*model)->parameters()) {
      const std::vector<float> g = testing::ToHost(**backend, p.param->grad);
      run.insert(run.end(), g.begin(), g.end());
    }
  }
  EXPECT_EQ(runs[0], runs[1]);
}

// A value a layer that takes only NCHW reads (a max pooling, a flatten), the model's output, a
// channel count that is not a multiple of 16, and values fused layers alias all stay NCHW; so do
// the images of a layer that keeps its input's layout next to one of them.
TEST(Model, KeepsNchwWhereAReaderOrTheChannelCountNeedsIt) {
  auto backend = CreateBackend("cpu", {2});
  ASSERT_OK(backend);
  const ModelConfig c{
      {16, 8, 8},
      {Conv2dConfig{16, 16, 3, 1, 1}, BatchNormOf(16), ReluConfig{}, MaxPool2dConfig{2},
       Conv2dConfig{16, 8, 3, 1, 1}, BatchNormOf(8), Conv2dConfig{8, 16, 3, 1, 1}, ReluConfig{},
       FlattenConfig{}, LinearConfig{16 * 16, 3}}};
  auto model = Model::Build(c, backend->get(), 1);
  ASSERT_OK(model);
  // conv -> bn -> relu -> maxpool: the max pooling takes NCHW, and batch norm and ReLU keep it.
  for (size_t i : {0, 1, 2, 3, 4, 5})
    EXPECT_EQ((*model)->output_layout(i), ImageLayout::kNchw) << i;
  // The last conv2d's ReLU is fused into it, and flatten reads it.
  EXPECT_TRUE((*model)->layer_fused(7));
  EXPECT_EQ((*model)->output_layout(6), ImageLayout::kNchw);
  ExpectFusedMatchesSeparate(c, 3, 1e-5);
}

// Pooling that overlaps or pads is not fused, and a conv2d output read twice fuses nothing.
TEST(Model, MaxPoolFusesOnlyOverNonOverlappingWindowsOfASingleReader) {
  auto backend = CreateBackend("cpu", {2});
  ASSERT_OK(backend);
  const ModelConfig overlapping{{1, 8, 8},
                                {Conv2dConfig{1, 16, 3}, ReluConfig{}, MaxPool2dConfig{3, 2},
                                 FlattenConfig{}, LinearConfig{16 * 2 * 2, 3}}};
  auto m = Model::Build(overlapping, backend->get(), 1);
  ASSERT_OK(m);
  EXPECT_TRUE((*m)->layer_fused(1));
  EXPECT_FALSE((*m)->layer_fused(2));
  ExpectFusedMatchesSeparate(overlapping, 2);
  const ModelConfig padded{{1, 8, 8},
                           {Conv2dConfig{1, 16, 3}, MaxPool2dConfig{2, 2, 1}, FlattenConfig{},
                            LinearConfig{16 * 4 * 4, 3}}};
  m = Model::Build(padded, backend->get(), 1);
  ASSERT_OK(m);
  EXPECT_FALSE((*m)->layer_fused(1));
  // 16x16 windows have more positions than a byte of winner records.
  const ModelConfig wide{
      {1, 18, 18},
      {Conv2dConfig{1, 16, 3}, MaxPool2dConfig{16}, FlattenConfig{}, LinearConfig{16, 3}}};
  m = Model::Build(wide, backend->get(), 1);
  ASSERT_OK(m);
  EXPECT_FALSE((*m)->layer_fused(1));
  ExpectFusedMatchesSeparate(wide, 2);
}
}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// The one-row GEMM path (sgemv) gives what the general path gives, for both layouts of B.
TEST(CpuGemm, SingleRowMatchesGeneralPath) {
  auto backend = CreateBackend("cpu", {1});
  ASSERT_OK(backend);
  const int k = 7, n = 5;
  const std::vector<float> a = testing::RandomValues(2 * k, 1), b = testing::RandomValues(n * k, 2);
  for (Transpose tb : {Transpose::kNo, Transpose::kYes}) {
    std::vector<float> two(2 * n, 0.5f), one(n, 0.5f);
    ASSERT_OK(
        (*backend)->Gemm(Transpose::kNo, tb, 2, n, k, 1.5f, a.data(), b.data(), 2.0f, two.data()));
    ASSERT_OK(
        (*backend)->Gemm(Transpose::kNo, tb, 1, n, k, 1.5f, a.data(), b.data(), 2.0f, one.data()));
    for (int j = 0; j < n; ++j) EXPECT_NEAR(one[j], two[j], 1e-5f) << j;
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// The CPU convolution (direct for one input channel at stride 1, im2col + GEMM otherwise)
// against the definition, written as plain loops, with bias, padding, strides and the fused ReLU.
struct ConvForwardCase {
  int c, h, w, oc, k, stride, pad;
  bool relu;
};
class ConvForward : public ::testing::TestWithParam<ConvForwardCase> {};

TEST_P(ConvForward, MatchesTheDefinition) {
  const ConvForwardCase p = GetParam();
  auto backend = CreateBackend("cpu", {2});
  ASSERT_OK(backend);
  Conv2dGeometry g;
  g.batch = 3;
  g.in_channels = p.c;
  g.in_h = p.h;
  g.in_w = p.w;
  g.out_channels = p.oc;
  g.kernel_h = g.kernel_w = p.k;
  g.stride_h = g.stride_w = p.stride;
  g.padding_h = g.padding_w = p.pad;
  const int oh = g.out_h(), ow = g.out_w();
  const std::vector<float> x = testing::RandomValues(size_t{3} * p.c * p.h * p.w, 11);
  const std::vector<float> w =
      testing::RandomValues(static_cast<size_t>(p.oc) * p.c * p.k * p.k, 12);
  const std::vector<float> bias = testing::RandomValues(static_cast<size_t>(p.oc), 13);
  std::vector<float> y(static_cast<size_t>(3 * p.oc * oh * ow));
  ASSERT_OK((*backend)->Conv2dForward(g, x.data(), w.data(), bias.data(),
                                      p.relu ? Activation::kRelu : Activation::kNone, y.data()));
  for (int n = 0; n < 3; ++n) {
    for (int o = 0; o < p.oc; ++o) {
      for (int i = 0; i < oh; ++i) {
        for (int j = 0; j < ow; ++j) {
          double sum = bias[o];
          for (int c = 0; c < p.c; ++c) {
            for (int a = 0; a < p.k; ++a) {
              for (int b = 0; b < p.k; ++b) {
                const int yy = i * p.stride - p.pad + a, xx = j * p.stride - p.pad + b;
                if (yy < 0 || yy >= p.h || xx < 0 || xx >= p.w) continue;
                sum += double{w[((o * p.c + c) * p.k + a) * p.k + b]} *
                       x[((n * p.c + c) * p.h + yy) * p.w + xx];
              }
            }
          }
          if (p.relu && sum < 0) sum = 0;
          ASSERT_NEAR(y[((n * p.oc + o) * oh + i) * ow + j], sum, 1e-5)
              << "sample " << n << " channel " << o << " at " << i << "," << j;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Geometries, ConvForward,
                         ::testing::Values(ConvForwardCase{1, 28, 28, 4, 3, 1, 0, true},
                                           ConvForwardCase{1, 7, 9, 3, 3, 1, 1, false},
                                           ConvForwardCase{1, 6, 5, 2, 5, 1, 2, true},
                                           ConvForwardCase{1, 8, 8, 2, 3, 2, 1, false},
                                           ConvForwardCase{3, 9, 7, 4, 3, 1, 1, true},
                                           ConvForwardCase{2, 9, 9, 3, 3, 2, 0, false}));

}  // namespace
}  // namespace kiln
