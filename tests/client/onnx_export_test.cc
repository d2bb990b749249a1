// The ONNX exporter (client/onnx): the graph it writes for every layer kind, and the writer of
// trained checkpoints, their ONNX files and kiln's own outputs for the independent checks
// (tests/client/onnx_export_check.py, tests/client/torch_sequential_check.py):
//   dir=$(mktemp -d)
//   KILN_ONNX_EXPORT_DIR="$dir" onnx_export_tests --gtest_filter='OnnxExportInterop.*'
//   tests/client/onnx_export_check.py "$dir"
// ctest runs both steps (onnx_export_roundtrip, torch_loads_reference_checkpoints).
#include "client/onnx/onnx_export.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend_registry.h"
#include "engine/model/checkpoint.h"
#include "engine/data/dataset.h"
#include "engine/inference.h"
#include "engine/model/model.h"
#include "engine/rng.h"
#include "engine/model/safetensors.h"
#include "engine/trainer.h"
#include "tests/engine/gpt_config.h"
#include "tests/engine/test_util.h"
#include "tests/support/status_matchers.h"

namespace kiln::client {
namespace {

using ::kiln::testing::TempDir;

BatchNormFields Fields(int64_t features, bool affine = true) {
  BatchNormFields f;
  f.num_features = features;
  f.affine = affine;
  return f;
}

Conv2dConfig Conv(int64_t in, int64_t out, int64_t k, int64_t padding, bool bias = true) {
  Conv2dConfig c;
  c.in_channels = in;
  c.out_channels = out;
  c.kernel_size = k;
  c.padding = padding;
  c.bias = bias;
  return c;
}

// Every layer kind in one residual graph over 3x8x8 images, 5 classes: convolutions with and
// without bias and per-axis kernels, strides and padding; BatchNorm with and without affine
// parameters; add and concat; padded pooling; every activation; a linear layer reading a CxHxW
// value directly.
ModelConfig EveryLayerGraph() {
  ModelConfig c;
  c.input_shape = {3, 8, 8};
  Conv2dConfig tall = Conv(8, 8, 3, 1);
  tall.kernel_w = 1;
  tall.padding_w = 0;
  Conv2dConfig down = Conv(12, 8, 3, 1);
  down.stride_h = 2;
  down.padding_w = 0;
  MaxPool2dConfig pool;
  pool.kernel_size = 3;
  pool.stride = 2;
  pool.padding = 1;
  AvgPool2dConfig avg;
  avg.kernel_size = 2;
  avg.stride = 1;
  avg.padding = 1;
  AdaptiveAvgPool2dConfig rows;
  rows.output_h = 3;
  rows.output_w = 1;
  DropoutConfig drop;
  drop.p = 0.3f;
  c.layers = {Conv(3, 8, 3, 1, false),
              BatchNorm2dConfig{Fields(8)},
              ReluConfig{},
              tall,
              BatchNorm2dConfig{Fields(8, false)},
              GeluConfig{},
              AddConfig{},
              Conv(8, 4, 3, 1),
              SiluConfig{},
              ConcatConfig{},
              pool,
              LeakyReluConfig{0.1f},
              avg,
              down,
              TanhConfig{},
              rows,
              AdaptiveAvgPool2dConfig{},
              drop,
              LinearConfig{8, 16},
              BatchNorm1dConfig{Fields(16)},
              SigmoidConfig{},
              LinearConfig{16, 5, false}};
  c.names = {"stem",      "stem_bn",   "stem_relu", "block.conv", "block.bn", "block.gelu",
             "block.add", "side.conv", "side.silu", "cat",        "pool",     "lrelu",
             "avg",       "down",      "tanh",      "rows",       "gap",      "drop",
             "fc1",       "fc1_bn",    "sig",       "fc"};
  c.inputs.resize(c.layers.size());
  c.inputs[6] = {"block.gelu", "stem_relu"};
  c.inputs[7] = {"stem_relu"};
  c.inputs[9] = {"block.add", "side.silu"};
  return c;
}

// The table reference shape: Linear-BatchNorm1d-ReLU-Dropout-Linear over 12 features.
ModelConfig TableMlp() {
  ModelConfig c;
  c.input_shape = {12};
  c.layers = {LinearConfig{12, 32}, BatchNorm1dConfig{Fields(32)}, ReluConfig{},
              DropoutConfig{0.2f}, LinearConfig{32, 4}};
  return c;
}

PixelNorm MnistNorm() { return PixelNorm(1.0f / 255.0f, 0.1307f, 0.3081f); }

PixelNorm ChannelNorm() {
  PixelNorm n;
  n.channel_mean = {0.4f, 0.5f, 0.3f};
  n.channel_std = {0.25f, 0.2f, 0.3f};
  return n;
}

// A learnable image set of `shape`: class k brightens the k-th of `classes` bands of the sample
// (rows of CxHxW images), over noise.
Dataset BandImages(const Shape& shape, int classes, int64_t n, uint64_t seed) {
  Dataset d;
  d.sample_shape = shape;
  d.size = n;
  d.num_classes = classes;
  const int64_t elems = NumElements(shape);
  d.pixels.resize(n * elems);
  d.labels.resize(n);
  Rng rng(seed);
  for (int64_t i = 0; i < n; ++i) {
    const int label = static_cast<int>(rng.Below(classes));
    d.labels[i] = label;
    for (int64_t j = 0; j < elems; ++j) {
      const bool lit = j * classes / elems == label;
      d.pixels[i * elems + j] = static_cast<uint8_t>((lit ? 150 : 0) + rng.Uniform(0, 100));
    }
  }
  return d;
}

// A learnable table: each feature has its own offset and spread (so the standardisation
// matters), and class k raises the features j with j % classes == k.
Dataset BandTable(int64_t features, int classes, int64_t n, uint64_t seed) {
  Dataset d;
  d.sample_shape = {features};
  d.size = n;
  d.num_classes = classes;
  d.features.resize(n * features);
  d.labels.resize(n);
  Rng rng(seed);
  for (int64_t i = 0; i < n; ++i) {
    const int label = static_cast<int>(rng.Below(classes));
    d.labels[i] = label;
    for (int64_t j = 0; j < features; ++j) {
      const float lit = j % classes == label ? 1.5f : 0.0f;
      d.features[i * features + j] = (lit + rng.Uniform(-1, 1)) * (1 + j) + 10.0f * j;
    }
  }
  return d;
}

// The train split's per-feature mean and std, as kiln standardises CSV tables.
PixelNorm FeatureNorm(const Dataset& d) {
  PixelNorm n;
  n.scale = 1.0f;
  n.input = NormInput::kFeatures;
  const int64_t f = d.sample_elems();
  for (int64_t j = 0; j < f; ++j) {
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < d.size; ++i) sum += d.features[i * f + j];
    const double mean = sum / d.size;
    for (int64_t i = 0; i < d.size; ++i) {
      const double v = d.features[i * f + j] - mean;
      sq += v * v;
    }
    n.channel_mean.push_back(static_cast<float>(mean));
    n.channel_std.push_back(static_cast<float>(std::sqrt(sq / d.size)));
  }
  return n;
}

absl::StatusOr<std::unique_ptr<Backend>> Cpu() { return CreateBackend("cpu", {2}); }

// Writes an untrained checkpoint of `config` with `norm` to `path`.
void WriteUntrained(const ModelConfig& config, const PixelNorm& norm, const std::string& path) {
  auto backend = Cpu();
  ASSERT_OK(backend);
  auto model = Model::Build(config, backend->get(), 2);
  ASSERT_OK(model);
  ASSERT_OK(WriteCheckpoint(path, **model, nullptr, {}, norm));
}

std::multiset<std::string> OpTypes(const ::onnx::ModelProto& m) {
  std::multiset<std::string> ops;
  for (const auto& n : m.graph().node()) ops.insert(n.op_type());
  return ops;
}

TEST(OnnxExport, WritesEveryLayerKindWithTheNormalisationFoldedIn) {
  TempDir dir;
  const std::string path = dir.path() + "/graph.safetensors";
  WriteUntrained(EveryLayerGraph(), ChannelNorm(), path);
  auto m = CheckpointToOnnx(path);
  ASSERT_OK(m);
  ASSERT_EQ(m->opset_import_size(), 1);
  EXPECT_EQ(m->opset_import(0).version(), kOnnxOpset);
  const ::onnx::GraphProto& g = m->graph();
  ASSERT_EQ(g.input_size(), 1);
  EXPECT_EQ(g.input(0).name(), "input");
  const auto& in_type = g.input(0).type().tensor_type();
  EXPECT_EQ(in_type.elem_type(), ::onnx::TensorProto::UINT8);
  ASSERT_EQ(in_type.shape().dim_size(), 4);
  EXPECT_EQ(in_type.shape().dim(0).dim_param(), "N");
  EXPECT_EQ(in_type.shape().dim(1).dim_value(), 3);
  ASSERT_EQ(g.output_size(), 2);
  EXPECT_EQ(g.output(0).name(), "logits");
  EXPECT_EQ(g.output(1).name(), "probabilities");
  EXPECT_EQ(g.output(1).type().tensor_type().shape().dim(1).dim_value(), 5);
  // The normalisation comes first: cast, scale, per-channel mean and std.
  ASSERT_GE(g.node_size(), 4);
  EXPECT_EQ(g.node(0).op_type(), "Cast");
  EXPECT_EQ(g.node(1).op_type(), "Mul");
  EXPECT_EQ(g.node(2).op_type(), "Sub");
  EXPECT_EQ(g.node(3).op_type(), "Div");
  const std::multiset<std::string> ops = OpTypes(*m);
  for (const char* op :
       {"Conv", "BatchNormalization", "Relu", "Erf", "Add", "Sigmoid", "Concat", "MaxPool",
        "LeakyRelu", "AveragePool", "Tanh", "GlobalAveragePool", "Flatten", "Gemm", "Softmax"}) {
    EXPECT_EQ(ops.count(op) > 0, true) << op;
  }
  EXPECT_EQ(ops.count("Conv"), 4u);
  EXPECT_EQ(ops.count("BatchNormalization"), 3u);
  EXPECT_EQ(ops.count("Dropout"), 0u);  // identity at inference: not emitted
  // Initializers keep the state-dict names; BatchNorm without affine gets ones and zeros.
  std::set<std::string> inits;
  for (const auto& t : g.initializer()) inits.insert(t.name());
  for (const char* name : {"stem.weight", "stem_bn.running_var", "block.conv.bias",
                           "block.bn.onnx_scale", "fc1_bn.weight", "fc.weight"}) {
    EXPECT_EQ(inits.count(name), 1u) << name;
  }
  EXPECT_EQ(inits.count("stem.bias"), 0u);
  EXPECT_EQ(inits.count("fc.bias"), 0u);
  std::map<std::string, std::string> props;
  for (const auto& p : m->metadata_props()) props[p.key()] = p.value();
  EXPECT_EQ(props.count("kiln.model"), 1u);
  EXPECT_NE(props["kiln.norm"].find(";0.400000006,0.5,0.300000012;"), std::string::npos)
      << props["kiln.norm"];
}

TEST(OnnxExport, TableModelsTakeFloatFeaturesWithoutACast) {
  TempDir dir;
  const std::string path = dir.path() + "/table.safetensors";
  PixelNorm norm;
  norm.scale = 1.0f;
  norm.input = NormInput::kFeatures;
  norm.channel_mean.assign(12, 2.0f);
  norm.channel_std.assign(12, 3.0f);
  WriteUntrained(TableMlp(), norm, path);
  auto m = CheckpointToOnnx(path);
  ASSERT_OK(m);
  const auto& in_type = m->graph().input(0).type().tensor_type();
  EXPECT_EQ(in_type.elem_type(), ::onnx::TensorProto::FLOAT);
  EXPECT_EQ(m->graph().node(0).op_type(), "Sub");  // scale 1: no Cast, no Mul
  EXPECT_EQ(OpTypes(*m).count("Cast"), 0u);
}

TEST(OnnxExport, ModelEndingInSoftmaxAnswersProbabilitiesOnly) {
  TempDir dir;
  const std::string path = dir.path() + "/softmax.safetensors";
  ModelConfig c;
  c.input_shape = {6};
  c.layers = {LinearConfig{6, 3}, SoftmaxConfig{}};
  WriteUntrained(c, PixelNorm(), path);
  auto m = CheckpointToOnnx(path);
  ASSERT_OK(m);
  ASSERT_EQ(m->graph().output_size(), 1);
  EXPECT_EQ(m->graph().output(0).name(), "probabilities");
  EXPECT_EQ(OpTypes(*m).count("Softmax"), 1u);
}

TEST(OnnxExport, ANormalisationOnnxCannotBroadcastIsAnErrorNamingIt) {
  TempDir dir;
  const std::string path = dir.path() + "/odd.safetensors";
  ModelConfig c;
  c.input_shape = {4, 3};
  c.layers = {FlattenConfig{}, LinearConfig{12, 2}};
  PixelNorm norm;  // two channels over a 4x3 sample: planes of 6, not the first dimension
  norm.channel_mean = {0.1f, 0.2f};
  norm.channel_std = {0.5f, 0.5f};
  WriteUntrained(c, norm, path);
  auto m = CheckpointToOnnx(path);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(m.status().message().find("kiln.norm: 2 channels"), std::string::npos) << m.status();
}

TEST(OnnxExport, AFileThatIsNotACheckpointIsRefusedAndNothingIsWritten) {
  TempDir dir;
  const std::string path = dir.path() + "/junk.safetensors";
  std::ofstream(path) << "not a safetensors file";
  const std::string out = dir.path() + "/junk.onnx";
  const absl::Status s = ExportOnnx(path, out);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("junk.safetensors"), std::string::npos) << s;
  EXPECT_FALSE(std::filesystem::exists(out));
}

// A 2-layer character GPT (vocab 11, block 16, 4 heads, width 32) in nanoGPT's layout, lm_head
// tied to wte; the first attention has dropout, the identity at inference.
ModelConfig TinyGpt() {
  ModelConfig c = kiln::testing::GptConfig({11, 16, 2, 4, 32, /*tied=*/true});
  for (LayerConfig& layer : c.layers) {
    if (auto* a = std::get_if<CausalSelfAttentionConfig>(&layer)) {
      a->dropout = 0.1f;
      break;
    }
  }
  return c;
}

TEST(OnnxExport, AGptTakesTokenIdsOfAnyLengthAndSharesItsTiedTable) {
  TempDir dir;
  const std::string path = dir.path() + "/gpt.safetensors";
  WriteUntrained(TinyGpt(), PixelNorm(), path);
  auto m = CheckpointToOnnx(path);
  ASSERT_OK(m) << m.status();
  const ::onnx::GraphProto& g = m->graph();
  const auto& in_type = g.input(0).type().tensor_type();
  EXPECT_EQ(in_type.elem_type(), ::onnx::TensorProto::INT64);
  ASSERT_EQ(in_type.shape().dim_size(), 2);
  EXPECT_EQ(in_type.shape().dim(0).dim_param(), "N");
  EXPECT_EQ(in_type.shape().dim(1).dim_param(), "T");
  ASSERT_EQ(g.output_size(), 2);
  const auto& out_shape = g.output(0).type().tensor_type().shape();
  ASSERT_EQ(out_shape.dim_size(), 3);
  EXPECT_EQ(out_shape.dim(1).dim_param(), "T");
  EXPECT_EQ(out_shape.dim(2).dim_value(), 11);
  const std::multiset<std::string> ops = OpTypes(*m);
  for (const char* op : {"Gather", "Shape", "Slice", "ReduceMean", "Sqrt", "MatMul", "Split",
                         "Reshape", "Transpose", "Softmax", "Erf", "Concat"}) {
    EXPECT_GT(ops.count(op), 0u) << op;
  }
  EXPECT_EQ(ops.count("Split"), 2u);  // one per attention layer
  EXPECT_EQ(ops.count("Gemm"), 0u);   // every linear reads (N, T, d)
  EXPECT_EQ(ops.count("Cast"), 0u);   // no input normalisation for token ids
  EXPECT_EQ(ops.count("Dropout"), 0u);
  std::multiset<std::string> inits;
  for (const auto& t : g.initializer()) inits.insert(t.name());
  EXPECT_EQ(inits.count("wte.weight"), 1u);  // read by the Gather and, transposed, by lm_head
  EXPECT_EQ(inits.count("lm_head.weight"), 0u);
  EXPECT_EQ(inits.count("kiln.causal_mask"), 1u);
  for (const char* name : {"wpe.weight", "h.0.attn.c_attn.weight", "h.1.attn.c_proj.bias",
                           "h.0.ln_1.weight", "h.1.mlp.c_proj.weight", "ln_f.bias"}) {
    EXPECT_EQ(inits.count(name), 1u) << name;
  }
}

TEST(OnnxExport, AGptCheckpointMissingATensorIsAnErrorNamingTheLayer) {
  TempDir dir;
  const std::string path = dir.path() + "/gpt.safetensors";
  WriteUntrained(TinyGpt(), PixelNorm(), path);
  auto contents = ReadSafetensors(path);
  ASSERT_OK(contents);
  std::vector<HostTensor> kept;
  for (const HostTensor& t : contents->tensors) {
    if (t.name != "h.1.attn.c_attn.bias") kept.push_back(t);
  }
  ASSERT_OK(WriteSafetensors(path, kept, contents->metadata));
  auto m = CheckpointToOnnx(path);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(m.status().message().find("h.1.attn"), std::string::npos) << m.status();
  EXPECT_NE(m.status().message().find("h.1.attn.c_attn.bias"), std::string::npos) << m.status();
}

// What the interop writer trains: a model, its data and normalisation, its optimizer.
struct InteropCase {
  std::string name;
  ModelConfig model;
  PixelNorm norm;
  Dataset train, test;
  OptimizerConfig::Kind optimizer;
};

std::vector<InteropCase> InteropCases() {
  std::vector<InteropCase> cases;
  cases.push_back({"mlp", MnistMlpConfig(), MnistNorm(), BandImages({784}, 10, 320, 1),
                   BandImages({784}, 10, 100, 2), OptimizerConfig::Kind::kSgd});
  cases.push_back({"cnn", MnistCnnConfig(), MnistNorm(), BandImages({1, 28, 28}, 10, 320, 3),
                   BandImages({1, 28, 28}, 10, 100, 4), OptimizerConfig::Kind::kAdam});
  cases.push_back({"graph", EveryLayerGraph(), ChannelNorm(), BandImages({3, 8, 8}, 5, 320, 5),
                   BandImages({3, 8, 8}, 5, 100, 6), OptimizerConfig::Kind::kAdam});
  Dataset table_train = BandTable(12, 4, 320, 7);
  PixelNorm table_norm = FeatureNorm(table_train);
  cases.push_back({"table", TableMlp(), table_norm, std::move(table_train),
                   BandTable(12, 4, 100, 8), OptimizerConfig::Kind::kAdam});
  return cases;
}

// kiln's logits for `test`: the raw samples normalised as kiln's GatherNormalize does, then an
// evaluation forward pass.
std::vector<float> KilnLogits(Trainer& trainer, const Dataset& test, const PixelNorm& norm) {
  Backend& b = *trainer.backend();
  const int64_t elems = test.sample_elems();
  auto folded = FoldPixelNorm(norm, elems);
  EXPECT_OK(folded);
  std::vector<float> x(test.size * elems);
  for (int64_t i = 0; i < test.size * elems; ++i) {
    const int64_t c = (i % elems) / folded->plane;
    const float raw = test.has_features() ? test.features[i] : test.pixels[i];
    x[i] = raw * folded->a[c] + folded->b[c];
  }
  Shape shape = trainer.config().model.input_shape;
  shape.insert(shape.begin(), test.size);
  auto out = trainer.model().Forward(kiln::testing::MakeTensor(b, shape, x), Mode::kEval);
  EXPECT_OK(out);
  return out.ok() ? kiln::testing::ToHost(b, **out) : std::vector<float>{};
}

// Per case: DIR/NAME.safetensors (trained briefly), DIR/NAME.onnx (ExportOnnx), and
// DIR/NAME.eval.safetensors: the test split ("input" U8 or F32, "labels" I64) with kiln's
// "logits", served "probabilities" and "classes" (InferenceSession, the deployed path), and
// kiln's test accuracy in the metadata ("accuracy").
TEST(OnnxExportInterop, WritesTrainedCheckpointsTheirOnnxFilesAndKilnsOutputs) {
  const char* dir = std::getenv("KILN_ONNX_EXPORT_DIR");
  if (dir == nullptr) GTEST_SKIP() << "KILN_ONNX_EXPORT_DIR not set";
  auto backend = Cpu();
  ASSERT_OK(backend);
  for (InteropCase& c : InteropCases()) {
    SCOPED_TRACE(c.name);
    TrainConfig tc;
    tc.model = c.model;
    tc.optimizer.kind = c.optimizer;
    tc.optimizer.lr = c.optimizer == OptimizerConfig::Kind::kSgd ? 0.05f : 0.003f;
    tc.optimizer.momentum = c.optimizer == OptimizerConfig::Kind::kSgd ? 0.9f : 0.0f;
    tc.epochs = c.name == "graph" ? 8 : 2;  // the deep graph learns slower
    tc.batch_size = 32;
    tc.seed = 11;
    tc.norm = c.norm;
    auto trainer = Trainer::Create(tc, backend->get(), &c.train, &c.test);
    ASSERT_OK(trainer);
    ASSERT_OK((*trainer)->Run({}));
    auto eval = (*trainer)->Evaluate(c.test);
    ASSERT_OK(eval);
    const std::string base = absl::StrCat(dir, "/", c.name);
    ASSERT_OK((*trainer)->SaveCheckpoint(base + ".safetensors"));
    ASSERT_OK(ExportOnnx(base + ".safetensors", base + ".onnx"));

    const std::vector<float> logits = KilnLogits(**trainer, c.test, c.norm);
    auto session = InferenceSession::FromCheckpoint(base + ".safetensors", backend->get(),
                                                    static_cast<int>(c.test.size));
    ASSERT_OK(session);
    const int64_t classes = (*session)->num_classes();
    std::vector<float> probs(c.test.size * classes);
    std::vector<int32_t> predicted(c.test.size);
    const int n = static_cast<int>(c.test.size);
    if (c.test.has_features()) {
      ASSERT_OK((*session)->Predict({nullptr, 0, c.test.features.data(), n}, probs.data(),
                                    predicted.data()));
    } else {
      ASSERT_OK((*session)->PredictU8(c.test.pixels.data(), n, probs.data(), predicted.data()));
    }
    Shape in_shape = c.model.input_shape;
    in_shape.insert(in_shape.begin(), c.test.size);
    HostTensor input;
    if (c.test.has_features()) {
      input = HostTensorFromF32("input", c.test.features.data(), in_shape);
    } else {
      input.name = "input";
      input.dtype = SafetensorDType::kU8;
      input.shape = in_shape;
      input.bytes = c.test.pixels;
    }
    ASSERT_OK(WriteSafetensors(
        base + ".eval.safetensors",
        {input,
         HostTensorFromI64("labels",
                           std::vector<int64_t>(c.test.labels.begin(), c.test.labels.end())),
         HostTensorFromF32("logits", logits.data(), {c.test.size, classes}),
         HostTensorFromF32("probabilities", probs.data(), {c.test.size, classes}),
         HostTensorFromI64("classes", std::vector<int64_t>(predicted.begin(), predicted.end()))},
        {{"accuracy", absl::StrCat(eval->accuracy)}}));
    std::printf("%s: kiln test accuracy %.4f\n", c.name.c_str(), eval->accuracy);
  }
}

constexpr int64_t kBlock = 16;  // TinyGpt's

// Token windows of `t` ids from seed, as int32 (kiln's input) and int64 (ONNX's).
void TokenWindows(int64_t n, int64_t t, uint64_t seed, std::vector<int32_t>* ids32,
                  std::vector<int64_t>* ids64) {
  Rng rng(seed);
  ids32->resize(n * t);
  ids64->resize(n * t);
  for (int64_t i = 0; i < n * t; ++i)
    (*ids64)[i] = (*ids32)[i] = static_cast<int32_t>(rng.Below(11));
}

// DIR/gpt.safetensors: TinyGpt with every parameter moved off its init (layer norms' scales and
// biases not one and zero; attention sharp enough to tell positions apart); DIR/gpt.onnx; and
// DIR/gpt.eval.safetensors: int64 ids "input" [5, 16] and "input_short" [5, 6] (a window shorter
// than the block) with kiln's eval "logits" and "logits_short" for them.
TEST(OnnxExportInterop, WritesAGptCheckpointItsOnnxFileAndKilnsLogits) {
  const char* dir = std::getenv("KILN_ONNX_EXPORT_DIR");
  if (dir == nullptr) GTEST_SKIP() << "KILN_ONNX_EXPORT_DIR not set";
  auto backend = Cpu();
  ASSERT_OK(backend);
  Backend& b = **backend;
  auto model = Model::Build(TinyGpt(), &b, 9);
  ASSERT_OK(model) << model.status();
  uint32_t seed = 300;
  for (const NamedParameter& p : (*model)->parameters()) {
    const bool scale = p.name.find(".ln_") != std::string::npos || p.name.starts_with("ln_f");
    const bool is_vector = p.param->value.rank() == 1;
    const float lo = is_vector ? (scale && p.name.ends_with("weight") ? 0.5f : -0.2f) : -0.3f;
    const float hi = is_vector ? (scale && p.name.ends_with("weight") ? 1.5f : 0.2f) : 0.3f;
    const std::vector<float> v =
        kiln::testing::RandomValues(p.param->value.numel(), ++seed, lo, hi);
    ASSERT_OK(b.CopyFromHost(v.data(), v.size() * 4, &p.param->value));
  }
  const std::string base = absl::StrCat(dir, "/gpt");
  ASSERT_OK(WriteCheckpoint(base + ".safetensors", **model, nullptr, {}, PixelNorm()));
  ASSERT_OK(ExportOnnx(base + ".safetensors", base + ".onnx"));
  std::vector<HostTensor> eval;
  for (const auto& [name, t] :
       std::vector<std::pair<std::string, int64_t>>{{"", kBlock}, {"_short", 6}}) {
    const int64_t n = 5;
    std::vector<int32_t> ids32;
    std::vector<int64_t> ids64;
    TokenWindows(n, t, 40 + t, &ids32, &ids64);
    // kiln's model takes full blocks: a shorter window runs padded with id 0, and its logits are
    // the first t positions' (causal attention keeps the padding out, as generation relies on).
    std::vector<int32_t> padded(n * kBlock, 0);
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(ids32.begin() + i * t, t, padded.begin() + i * kBlock);
    }
    auto ids = b.Allocate(DType::kI32, {n, kBlock});
    ASSERT_OK(ids);
    ASSERT_OK(b.CopyFromHost(padded.data(), padded.size() * 4, &*ids));
    auto out = (*model)->Forward(*ids, Mode::kEval);
    ASSERT_OK(out) << out.status();
    const std::vector<float> all = kiln::testing::ToHost(b, **out);
    std::vector<float> logits;
    for (int64_t i = 0; i < n; ++i) {
      logits.insert(logits.end(), all.begin() + i * kBlock * 11,
                    all.begin() + (i * kBlock + t) * 11);
    }
    HostTensor input = HostTensorFromI64("input" + name, ids64);
    input.shape = {n, t};
    eval.push_back(std::move(input));
    eval.push_back(HostTensorFromF32("logits" + name, logits.data(), {n, t, 11}));
  }
  ASSERT_OK(WriteSafetensors(base + ".eval.safetensors", eval, {}));
}

}  // namespace
}  // namespace kiln::client
