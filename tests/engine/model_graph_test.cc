// Models as graphs of named nodes: the spec's rules (names, inputs, cycles, unused nodes), shapes
// through add and concat, state-dict names, JSON round trips, and forward values of a residual
// block computed by hand.
#include "engine/model/model_graph.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "engine/backend_registry.h"
#include "engine/model/checkpoint.h"
#include "engine/inference.h"
#include "engine/memory_plan.h"
#include "engine/model/model.h"
#include "engine/model/model_config_json.h"
#include "tests/engine/test_util.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

using testing::MakeTensor;
using testing::ToHost;

// A ResNet basic block without BatchNorm on 2x6x6 images: stem conv, then conv-relu-conv, plus
// a shortcut (identity, or a strided 1x1 conv when `projection`), add, relu, and a classifier.
ModelConfig ResidualBlock(bool projection) {
  ModelConfig c;
  c.input_shape = {2, 6, 6};
  const int64_t stride = projection ? 2 : 1, out = projection ? 4 : 3;
  c.layers = {Conv2dConfig{2, 3, 3, 1, 1},
              ReluConfig{},
              Conv2dConfig{3, out, 3, stride, 1},
              ReluConfig{},
              Conv2dConfig{out, out, 3, 1, 1},
              Conv2dConfig{3, out, 1, stride, 0},
              AddConfig{},
              ReluConfig{},
              FlattenConfig{},
              LinearConfig{out * (6 / stride) * (6 / stride), 5}};
  c.names = {"stem",           "stem_relu",
             "layer1.0.conv1", "layer1.0.relu1",
             "layer1.0.conv2", "layer1.0.shortcut",
             "layer1.0.add",   "layer1.0.relu2",
             "flatten",        "fc"};
  c.inputs.resize(c.layers.size());
  c.inputs[5] = {"stem_relu"};
  c.inputs[6] = {"layer1.0.conv2", "layer1.0.shortcut"};
  c.inputs[7] = {"layer1.0.add"};
  if (!projection) {
    // Identity: the add reads the stem's output itself; no shortcut node.
    c.layers.erase(c.layers.begin() + 5);
    c.names.erase(c.names.begin() + 5);
    c.inputs.erase(c.inputs.begin() + 5);
    c.inputs[5] = {"layer1.0.conv2", "stem_relu"};
    c.inputs[6].clear();
  }
  return c;
}

std::string GraphError(const ModelConfig& c) {
  auto s = InferShapes(c);
  EXPECT_FALSE(s.ok());
  return std::string(s.status().message());
}

// input -> a: linear 4->3, b: linear 4->3 (reads input), add(a, b).
ModelConfig TwoBranches() {
  ModelConfig c;
  c.input_shape = {4};
  c.layers = {LinearConfig{4, 3}, LinearConfig{4, 3}, AddConfig{}};
  c.names = {"a", "b", "sum"};
  c.inputs = {{}, {"input"}, {"a", "b"}};
  return c;
}

TEST(ModelGraph, SequentialSpecIsAChainNamedByIndex) {
  auto g = ResolveGraph(MnistMlpConfig());
  ASSERT_OK(g) << g.status();
  EXPECT_EQ(g->names, (std::vector<std::string>{"0", "1", "2", "3", "4"}));
  EXPECT_EQ(g->inputs, (std::vector<std::vector<int>>{{0}, {1}, {2}, {3}, {4}}));
  EXPECT_EQ(g->readers, (std::vector<int>{1, 1, 1, 1, 1, 0}));
}

TEST(ModelGraph, ResidualShapesAndSummedGradients) {
  const ModelConfig c = ResidualBlock(/*projection=*/true);
  auto shapes = InferShapes(c);
  ASSERT_OK(shapes) << shapes.status();
  EXPECT_EQ((*shapes)[6], Shape({4, 3, 3}));  // the shortcut
  EXPECT_EQ((*shapes)[7], Shape({4, 3, 3}));  // the add
  EXPECT_EQ(shapes->back(), Shape({5}));
  auto g = ResolveGraph(c);
  ASSERT_OK(g);
  EXPECT_EQ(g->readers[2], 2);  // stem_relu: conv1 and the shortcut
  // Backward meets the shortcut (node 5) first; conv1 (node 2) sums its gradient into it.
  EXPECT_TRUE(g->sums_gradient[2][0]);
  EXPECT_FALSE(g->sums_gradient[5][0]);
  EXPECT_EQ(GradientScratchElements(*g, *shapes), (std::vector<int64_t>{3 * 6 * 6}));
  EXPECT_EQ(CountParameters(c),
            (2 * 9 * 3 + 3) + (3 * 9 * 4 + 4) + (4 * 9 * 4 + 4) + (3 * 4 + 4) + (36 * 5 + 5));
}

TEST(ModelGraph, ConcatJoinsChannelsAndFeatures) {
  ModelConfig c;
  c.input_shape = {2, 5, 5};
  c.layers = {Conv2dConfig{2, 3, 1},   Conv2dConfig{2, 4, 3, 1, 1}, ConcatConfig{}, FlattenConfig{},
              LinearConfig{9 * 25, 6}, LinearConfig{9 * 25, 2},     ConcatConfig{}};
  c.names = {"a", "b", "cat", "flat", "fc1", "fc2", "out"};
  c.inputs = {{}, {"input"}, {"a", "b", "input"}, {}, {}, {"flat"}, {"fc1", "fc2"}};
  auto shapes = InferShapes(c);
  ASSERT_OK(shapes) << shapes.status();
  EXPECT_EQ((*shapes)[3], Shape({9, 5, 5}));
  EXPECT_EQ(shapes->back(), Shape({8}));
}

TEST(ModelGraph, TopologyErrorsNameTheNode) {
  ModelConfig c = TwoBranches();
  c.inputs[2] = {"a", "c"};
  EXPECT_EQ(GraphError(c),
            "node sum: input c names no node (inputs name earlier nodes or \"input\")");
  c = TwoBranches();
  c.inputs[2] = {"a", "sum"};
  EXPECT_EQ(GraphError(c),
            "node sum: input sum is the node itself (inputs name earlier nodes, "
            "so the graph has no cycles)");
  // a <- b <- a: a cycle can only be written with a later node as an input.
  c = TwoBranches();
  c.inputs[0] = {"b"};
  c.inputs[1] = {"a"};
  EXPECT_EQ(GraphError(c),
            "node a: input b is layer 1, which comes later (inputs name earlier "
            "nodes, so the graph has no cycles)");
  c = TwoBranches();
  c.names[1] = "a";
  EXPECT_EQ(GraphError(c), "node a: the name a is also layer 0's");
  // An explicit name that is another node's index.
  c = TwoBranches();
  c.names[0] = "";
  c.names[1] = "0";
  EXPECT_EQ(GraphError(c), "node 0: the name 0 is also layer 0's");
  c = TwoBranches();
  c.inputs[2] = {"a", "a"};
  EXPECT_EQ(GraphError(c),
            "node b: its output is not used (no later node reads it and only the "
            "last node's output is the model's)");
  c = TwoBranches();
  c.inputs[2] = {"a"};
  EXPECT_EQ(GraphError(c), "node sum: add needs at least 2 inputs, got 1");
  c = TwoBranches();
  c.layers[2] = LinearConfig{3, 3};
  EXPECT_EQ(GraphError(c), "node sum: linear takes one input, got 2");
  // A hostile name is cut in messages.
  c = TwoBranches();
  c.inputs[2] = {"a", std::string(100000, 'x')};
  EXPECT_EQ(GraphError(c), absl::StrCat("node sum: input ", std::string(128, 'x'),
                                        "... (100000 characters) names no node (inputs name "
                                        "earlier nodes or \"input\")"));
  c = TwoBranches();
  c.names[0] = std::string(200, 'y');
  const std::string cut =
      absl::StrCat("node ", std::string(128, 'y'), "... (200 characters): a name is letters");
  EXPECT_EQ(GraphError(c).substr(0, cut.size()), cut);
  c = TwoBranches();
  c.names[0] = "input";
  EXPECT_EQ(GraphError(c), "node input: the name \"input\" is reserved for the model's input");
  for (const char* bad : {"a..b", ".a", "a.", "a-b", "a b"}) {
    c = TwoBranches();
    c.names[0] = bad;
    EXPECT_EQ(GraphError(c), absl::StrCat("node ", bad,
                                          ": a name is letters, digits, '_' and '.' (no empty "
                                          "part between dots), at most 128 characters"));
  }
  c = TwoBranches();
  c.names[0] = "optimizer.a";
  EXPECT_EQ(GraphError(c),
            "node optimizer.a: names starting with \"optimizer\" are reserved for "
            "the optimizer's state in checkpoints");
  // An unnamed node is labelled by index and type.
  c = TwoBranches();
  c.names = {"a", "b"};
  c.inputs[2] = {"a"};
  EXPECT_EQ(GraphError(c), "layer 2 add: add needs at least 2 inputs, got 1");
  c = TwoBranches();
  c.names.push_back("extra");
  EXPECT_EQ(GraphError(c), "model has 3 layers but 4 names and 3 input lists");
}

TEST(ModelGraph, ShapeErrorsNameTheNodeAndBothInputs) {
  ModelConfig c = ResidualBlock(/*projection=*/true);
  std::get<Conv2dConfig>(c.layers[5]).stride = 1;  // the shortcut keeps 6x6
  EXPECT_EQ(GraphError(c),
            "node layer1.0.add: inputs layer1.0.conv2 is 4x3x3 but "
            "layer1.0.shortcut is 4x6x6");
  c = ResidualBlock(/*projection=*/true);
  std::get<Conv2dConfig>(c.layers[5]).out_channels = 3;
  EXPECT_EQ(GraphError(c),
            "node layer1.0.add: inputs layer1.0.conv2 is 4x3x3 but "
            "layer1.0.shortcut is 3x3x3");
  c = ResidualBlock(/*projection=*/true);
  std::get<Conv2dConfig>(c.layers[4]).in_channels = 3;
  EXPECT_EQ(GraphError(c), "node layer1.0.conv2: in_channels 3 but input is 4x3x3 (4 channels)");
  c = TwoBranches();
  c.layers[1] = LinearConfig{4, 2};
  EXPECT_EQ(GraphError(c), "node sum: inputs a is 3 but b is 2");
  c = TwoBranches();
  c.layers[2] = ConcatConfig{};
  EXPECT_OK(InferShapes(c));
  c.input_shape = {1, 4, 4};
  c.layers = {Conv2dConfig{1, 2, 3, 1, 0}, ConcatConfig{}};  // a is 2x2x2
  c.names = {"a", "cat"};
  c.inputs = {{"input"}, {"a", "input"}};
  EXPECT_EQ(GraphError(c),
            "node cat: inputs a is 2x2x2 but input is 1x4x4; concat needs all but "
            "the first dimension equal");
}

TEST(ModelGraph, StateDictNamesFollowTheNodes) {
  auto backend = CreateBackend("cpu", {1});
  ASSERT_OK(backend);
  auto model = Model::Build(ResidualBlock(/*projection=*/true), backend->get(), 0);
  ASSERT_OK(model) << model.status();
  std::vector<std::string> names;
  for (const auto& p : (*model)->parameters()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"stem.weight", "stem.bias", "layer1.0.conv1.weight",
                                             "layer1.0.conv1.bias", "layer1.0.conv2.weight",
                                             "layer1.0.conv2.bias", "layer1.0.shortcut.weight",
                                             "layer1.0.shortcut.bias", "fc.weight", "fc.bias"}));
  EXPECT_EQ(StateDictName("layer1.0.bn1", "running_mean"), "layer1.0.bn1.running_mean");
  // Unnamed nodes in a graph keep their index, as in a Sequential model.
  ModelConfig c = TwoBranches();
  c.names = {"", "b", "sum"};
  c.inputs[2] = {"0", "b"};
  auto m = Model::Build(c, backend->get(), 0);
  ASSERT_OK(m) << m.status();
  names.clear();
  for (const auto& p : (*m)->parameters()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "b.weight", "b.bias"}));
  EXPECT_EQ((*m)->node_name(0), "0");
  EXPECT_EQ((*m)->node_name(2), "sum");
}

// y = relu(W2 relu(W1 x)) + x computed on the host, against the model.
TEST(ModelGraph, ForwardOfAResidualMlpMatchesTheFormula) {
  auto backend = CreateBackend("cpu", {1});
  ASSERT_OK(backend);
  ModelConfig c;
  c.input_shape = {3};
  c.layers = {LinearConfig{3, 3, false}, ReluConfig{}, LinearConfig{3, 3, false}, AddConfig{},
              ReluConfig{}};
  c.inputs = {{}, {}, {}, {"2", "input"}, {}};
  auto model = Model::Build(c, backend->get(), 4);
  ASSERT_OK(model) << model.status();
  const std::vector<float> w1 = ToHost(**backend, (*model)->parameters()[0].param->value);
  const std::vector<float> w2 = ToHost(**backend, (*model)->parameters()[1].param->value);
  const std::vector<float> x = {0.5f, -1.0f, 2.0f, -0.25f, 0.75f, 1.5f};
  Tensor xt = MakeTensor(**backend, {2, 3}, x);
  auto y = (*model)->Forward(xt, Mode::kEval);
  ASSERT_OK(y);
  const std::vector<float> got = ToHost(**backend, **y);
  for (int n = 0; n < 2; ++n) {
    float h[3], o[3];
    for (int i = 0; i < 3; ++i) {
      h[i] = 0;
      for (int j = 0; j < 3; ++j) h[i] += w1[i * 3 + j] * x[n * 3 + j];
      h[i] = std::max(h[i], 0.0f);
    }
    for (int i = 0; i < 3; ++i) {
      o[i] = 0;
      for (int j = 0; j < 3; ++j) o[i] += w2[i * 3 + j] * h[j];
      EXPECT_NEAR(got[n * 3 + i], std::max(o[i] + x[n * 3 + i], 0.0f), 1e-5) << n << "," << i;
    }
  }
}

TEST(ModelGraph, ConvReluFusesOnlyWhenTheConvHasOneReader) {
  auto backend = CreateBackend("cpu", {1});
  ASSERT_OK(backend);
  // stem -> stem_relu is fused; conv2's output is read by the add only.
  auto model = Model::Build(ResidualBlock(/*projection=*/true), backend->get(), 0);
  ASSERT_OK(model);
  EXPECT_TRUE((*model)->layer_fused(1));
  EXPECT_TRUE((*model)->layer_fused(3));   // layer1.0.relu1 after conv1
  EXPECT_FALSE((*model)->layer_fused(7));  // relu2 reads the add
  // A conv2d read by a ReLU and by an add keeps its own output: no fusion.
  ModelConfig c;
  c.input_shape = {1, 4, 4};
  c.layers = {Conv2dConfig{1, 2, 3, 1, 1}, ReluConfig{}, AddConfig{}};
  c.inputs = {{}, {}, {"0", "1"}};
  auto m = Model::Build(c, backend->get(), 0);
  ASSERT_OK(m) << m.status();
  EXPECT_FALSE((*m)->layer_fused(1));
  Tensor x = MakeTensor(**backend, {1, 1, 4, 4}, testing::RandomValues(16, 3));
  auto y = (*m)->Forward(x, Mode::kEval);
  ASSERT_OK(y);
  // y = conv + relu(conv): where conv < 0 that is conv, else 2 conv; never all zero.
  const std::vector<float> out = ToHost(**backend, **y);
  int negative = 0;
  for (float v : out) negative += v < 0;
  EXPECT_GT(negative, 0);
}

TEST(ModelGraph, JsonRoundTripKeepsNamesAndInputs) {
  const ModelConfig c = ResidualBlock(/*projection=*/true);
  const std::string json = ModelConfigToJson(c);
  auto back = ModelConfigFromJson(json);
  ASSERT_OK(back) << back.status();
  EXPECT_EQ(ModelConfigToJson(*back), json);
  EXPECT_EQ(back->names, c.names);
  ASSERT_EQ(back->inputs.size(), 8u);  // the last node with inputs is layer 7
  EXPECT_EQ(back->inputs[6], (std::vector<std::string>{"layer1.0.conv2", "layer1.0.shortcut"}));
  EXPECT_TRUE(std::holds_alternative<AddConfig>(back->layers[6]));
  ModelConfig cat = TwoBranches();
  cat.layers[2] = ConcatConfig{};
  auto cat_back = ModelConfigFromJson(ModelConfigToJson(cat));
  ASSERT_OK(cat_back);
  EXPECT_TRUE(std::holds_alternative<ConcatConfig>(cat_back->layers[2]));
}

TEST(ModelGraph, OldSequentialJsonStillLoads) {
  // A checkpoint's kiln.model as written before graphs existed.
  const std::string old =
      R"({"input_shape":[64],"layers":[{"bias":true,"in_features":64,"out_features":16,)"
      R"("type":"linear"},{"type":"relu"},{"bias":true,"in_features":16,"out_features":4,)"
      R"("type":"linear"}]})";
  auto c = ModelConfigFromJson(old);
  ASSERT_OK(c) << c.status();
  EXPECT_TRUE(c->names.empty());
  EXPECT_TRUE(c->inputs.empty());
  EXPECT_EQ(ModelConfigToJson(*c), old);
  ASSERT_OK(InferShapes(*c));
}

TEST(ModelGraph, JsonFieldErrorsNameTheLayer) {
  auto c = ModelConfigFromJson(R"({"input_shape":[4],"layers":[{"type":"relu","name":3}]})");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "layer 0 relu: name must be a string");
  c = ModelConfigFromJson(R"({"input_shape":[4],"layers":[{"type":"relu","inputs":"x"}]})");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "layer 0 relu: inputs must be an array of node names");
}

// A graph model's checkpoint: saved with its node names, served by an InferenceSession that
// builds the same graph from the checkpoint's JSON, with the model's own classes.
TEST(ModelGraph, CheckpointOfAGraphServesTheSameClasses) {
  auto backend = CreateBackend("cpu", {1});
  ASSERT_OK(backend);
  const ModelConfig c = ResidualBlock(/*projection=*/true);
  auto model = Model::Build(c, backend->get(), 9);
  ASSERT_OK(model);
  testing::TempDir dir;
  const PixelNorm norm{1.0f / 255, 0.5f, 0.5f};
  ASSERT_OK(WriteCheckpoint(dir.file("g.safetensors"), **model, nullptr, {}, norm));
  auto info = ReadCheckpointInfo(dir.file("g.safetensors"));
  ASSERT_OK(info);
  EXPECT_EQ(ModelConfigToJson(info->model), ModelConfigToJson(c));
  auto session = InferenceSession::FromCheckpoint(dir.file("g.safetensors"), backend->get(), 4);
  ASSERT_OK(session) << session.status();
  std::vector<uint8_t> pixels(4 * 72);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>((i * 37) % 256);
  std::vector<float> probs(4 * 5);
  std::vector<int32_t> classes(4);
  ASSERT_OK((*session)->PredictU8(pixels.data(), 4, probs.data(), classes.data()));
  std::vector<float> x(pixels.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = (pixels[i] / 255.0f - 0.5f) / 0.5f;
  Tensor xt = MakeTensor(**backend, {4, 2, 6, 6}, x);
  auto y = (*model)->Forward(xt, Mode::kEval);
  ASSERT_OK(y);
  const std::vector<float> logits = ToHost(**backend, **y);
  for (int n = 0; n < 4; ++n) {
    const auto row = logits.begin() + n * 5;
    EXPECT_EQ(classes[n], std::max_element(row, row + 5) - row) << n;
  }
}

TEST(ModelGraph, MemoryPlanCountsTheGradientSums) {
  TrainConfig t;
  t.model = ResidualBlock(/*projection=*/true);
  t.optimizer.kind = OptimizerConfig::Kind::kSgd;
  t.batch_size = 16;
  auto plan = PlanTrainingMemory(t, 100, 0, {});
  ASSERT_OK(plan) << plan.status();
  int64_t sums = -1;
  for (const MemoryNeed& n : plan->needs) {
    if (n.what == "gradient sums of shared outputs") sums = n.bytes;
  }
  EXPECT_EQ(sums, 16 * 3 * 6 * 6 * 4);
  t.model = MnistMlpConfig();
  plan = PlanTrainingMemory(t, 100, 0, {});
  ASSERT_OK(plan);
  for (const MemoryNeed& n : plan->needs) EXPECT_NE(n.what, "gradient sums of shared outputs");
}

}  // namespace
}  // namespace kiln
