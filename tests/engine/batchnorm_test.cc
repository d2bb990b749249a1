// BatchNorm2d and BatchNorm1d: PyTorch's statistics against a double-precision reference,
// evaluation with the running statistics, the errors PyTorch gives, buffers in models and
// checkpoints, and CUDA against the CPU (skipped where there is no GPU).
#include "engine/layers/batchnorm.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend_registry.h"
#include "engine/model/checkpoint.h"
#include "engine/inference.h"
#include "engine/model/model.h"
#include "engine/model/model_config_json.h"
#include "engine/optim/optimizer.h"
#include "engine/model/safetensors.h"
#include "tests/engine/test_util.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

using testing::MakeTensor;
using testing::RandomValues;
using testing::TempDir;
using testing::ToHost;

BatchNormFields Fields(int64_t features, double momentum = 0.1, double eps = 1e-5) {
  BatchNormFields c;
  c.num_features = features;
  c.momentum = momentum;
  c.eps = eps;
  return c;
}

// PyTorch's batch statistics in double: per channel of x (batch, channels, spatial) the mean,
// the biased and the unbiased variance.
struct Stats {
  std::vector<double> mean, var, unbiased;
};
Stats Reference(const std::vector<float>& x, int batch, int channels, int64_t spatial) {
  Stats s;
  const double n = static_cast<double>(batch) * spatial;
  for (int c = 0; c < channels; ++c) {
    double sum = 0, sq = 0;
    for (int i = 0; i < batch; ++i) {
      for (int64_t k = 0; k < spatial; ++k) sum += x[(int64_t{i} * channels + c) * spatial + k];
    }
    const double mean = sum / n;
    for (int i = 0; i < batch; ++i) {
      for (int64_t k = 0; k < spatial; ++k) {
        const double d = x[(int64_t{i} * channels + c) * spatial + k] - mean;
        sq += d * d;
      }
    }
    s.mean.push_back(mean);
    s.var.push_back(sq / n);
    s.unbiased.push_back(sq / (n - 1));
  }
  return s;
}

StateBuffer* FindBuffer(Layer& layer, const std::string& name) {
  for (StateBuffer* b : layer.buffers()) {
    if (b->name == name) return b;
  }
  return nullptr;
}

class BatchNormTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string absent = testing::AbsentDeviceReason(GetParam());
    if (!absent.empty()) GTEST_SKIP() << absent;
    auto b = CreateBackend(GetParam(), {2});
    ASSERT_OK(b) << b.status();
    backend_ = std::move(*b);
  }
  std::unique_ptr<Backend> backend_;
};

// Two training steps: y is the batch-normalised input, the running statistics follow PyTorch's
// update with the unbiased variance, num_batches_tracked counts both; then evaluation uses the
// running statistics.
TEST_P(BatchNormTest, TrainingUpdatesRunningStatisticsAsPyTorch) {
  Backend& b = *backend_;
  const int batch = 4, channels = 3;
  const int64_t spatial = 5 * 6;
  const double momentum = 0.3, eps = 1e-3;
  auto layer = BatchNorm::Create("batchnorm2d", Fields(channels, momentum, eps), &b, {3, 5, 6});
  ASSERT_OK(layer);
  const std::vector<float> gamma = {0.5f, 2.0f, -1.0f}, beta = {0.1f, -0.2f, 0.3f};
  ASSERT_OK(b.CopyFromHost(gamma.data(), 12, &(*layer)->parameters()[0]->value));
  ASSERT_OK(b.CopyFromHost(beta.data(), 12, &(*layer)->parameters()[1]->value));
  auto y = b.Allocate(DType::kF32, {batch, 3, 5, 6});
  ASSERT_OK(y);
  std::vector<double> rm(channels, 0.0), rv(channels, 1.0);
  for (int step = 0; step < 2; ++step) {
    // A per-channel offset and scale, so the statistics differ between channels.
    std::vector<float> xv = RandomValues(batch * channels * spatial, 30 + step, -1, 1);
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = xv[i] * (1 + (i / spatial) % 3) + (step + 1);
    Tensor x = MakeTensor(b, {batch, 3, 5, 6}, xv);
    ASSERT_OK((*layer)->Forward(x, &*y, Mode::kTrain));
    const Stats s = Reference(xv, batch, channels, spatial);
    const std::vector<float> yv = ToHost(b, *y);
    for (size_t i = 0; i < xv.size(); ++i) {
      const int c = static_cast<int>((i / spatial) % channels);
      const double want = gamma[c] * (xv[i] - s.mean[c]) / std::sqrt(s.var[c] + eps) + beta[c];
      ASSERT_NEAR(yv[i], want, 2e-5) << "y[" << i << "] step " << step;
    }
    for (int c = 0; c < channels; ++c) {
      rm[c] = (1 - momentum) * rm[c] + momentum * s.mean[c];
      rv[c] = (1 - momentum) * rv[c] + momentum * s.unbiased[c];
    }
  }
  const std::vector<float> got_mean = ToHost(b, FindBuffer(**layer, "running_mean")->value);
  const std::vector<float> got_var = ToHost(b, FindBuffer(**layer, "running_var")->value);
  for (int c = 0; c < channels; ++c) {
    EXPECT_NEAR(got_mean[c], rm[c], 1e-6 * std::max(1.0, std::abs(rm[c]))) << c;
    EXPECT_NEAR(got_var[c], rv[c], 1e-6 * std::max(1.0, rv[c])) << c;
  }
  EXPECT_EQ(FindBuffer(**layer, "num_batches_tracked")->count, 2);
  EXPECT_EQ(FindBuffer(**layer, "num_batches_tracked")->kind, BufferKind::kI64Count);

  // Evaluation: the running statistics, which it leaves as they are.
  const std::vector<float> xv = RandomValues(2 * channels * spatial, 40, -3, 3);
  Tensor x = MakeTensor(b, {2, 3, 5, 6}, xv);
  ASSERT_TRUE(y->Reshape({2, 3, 5, 6}));
  ASSERT_OK((*layer)->Forward(x, &*y, Mode::kEval));
  const std::vector<float> yv = ToHost(b, *y);
  for (size_t i = 0; i < xv.size(); ++i) {
    const int c = static_cast<int>((i / spatial) % channels);
    const double want = gamma[c] * (xv[i] - rm[c]) / std::sqrt(rv[c] + eps) + beta[c];
    ASSERT_NEAR(yv[i], want, 2e-5) << "eval y[" << i << "]";
  }
  EXPECT_EQ(ToHost(b, FindBuffer(**layer, "running_mean")->value), got_mean);
  EXPECT_EQ(ToHost(b, FindBuffer(**layer, "running_var")->value), got_var);
  EXPECT_EQ(FindBuffer(**layer, "num_batches_tracked")->count, 2);
}

TEST_P(BatchNormTest, BatchNorm1dStatisticsPerFeatureAndOverLength) {
  Backend& b = *backend_;
  for (const Shape& shape : {Shape{5}, Shape{5, 3}}) {
    const int batch = 7;
    const int64_t spatial = shape.size() == 2 ? shape[1] : 1;
    auto layer = BatchNorm::Create("batchnorm1d", Fields(5), &b, shape);
    ASSERT_OK(layer);
    Shape xs = shape;
    xs.insert(xs.begin(), batch);
    const std::vector<float> xv = RandomValues(NumElements(xs), 50, -2, 4);
    Tensor x = MakeTensor(b, xs, xv);
    auto y = b.Allocate(DType::kF32, xs);
    ASSERT_OK((*layer)->Forward(x, &*y, Mode::kTrain));
    const Stats s = Reference(xv, batch, 5, spatial);
    const std::vector<float> yv = ToHost(b, *y);
    for (size_t i = 0; i < xv.size(); ++i) {
      const int c = static_cast<int>((i / spatial) % 5);
      ASSERT_NEAR(yv[i], (xv[i] - s.mean[c]) / std::sqrt(s.var[c] + 1e-5), 2e-5) << i;
    }
    const std::vector<float> rv = ToHost(b, FindBuffer(**layer, "running_var")->value);
    for (int c = 0; c < 5; ++c) EXPECT_NEAR(rv[c], 0.9 + 0.1 * s.unbiased[c], 1e-6);
  }
}

// PyTorch: "Expected more than 1 value per channel when training"; evaluation is fine.
TEST_P(BatchNormTest, OneValuePerChannelInTrainingIsAnError) {
  Backend& b = *backend_;
  auto bn1d = BatchNorm::Create("batchnorm1d", Fields(4), &b, {4});
  ASSERT_OK(bn1d);
  Tensor x = MakeTensor(b, {1, 4}, {1, 2, 3, 4});
  auto y = b.Allocate(DType::kF32, {1, 4});
  const absl::Status s = (*bn1d)->Forward(x, &*y, Mode::kTrain);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("batchnorm1d(num_features=4)"), std::string::npos) << s;
  EXPECT_NE(s.message().find("more than 1 value per channel"), std::string::npos) << s;
  EXPECT_EQ(FindBuffer(**bn1d, "num_batches_tracked")->count, 0);
  EXPECT_OK((*bn1d)->Forward(x, &*y, Mode::kEval));

  auto bn2d = BatchNorm::Create("batchnorm2d", Fields(2), &b, {2, 1, 1});
  ASSERT_OK(bn2d);
  Tensor x2 = MakeTensor(b, {1, 2, 1, 1}, {1, 2});
  auto y2 = b.Allocate(DType::kF32, {1, 2, 1, 1});
  EXPECT_EQ((*bn2d)->Forward(x2, &*y2, Mode::kTrain).code(), absl::StatusCode::kInvalidArgument);
}

// The running statistics and parameters survive a checkpoint, num_batches_tracked as a 0-dim I64
// tensor as in PyTorch's state_dict, and a file without them is refused naming the tensor.
TEST_P(BatchNormTest, CheckpointCarriesBuffers) {
  Backend& b = *backend_;
  ModelConfig config;
  config.input_shape = {2, 4, 4};
  config.layers = {Conv2dConfig{2, 3, 3, 1, 1, false},
                   BatchNorm2dConfig{Fields(3)},
                   ReluConfig{},
                   FlattenConfig{},
                   LinearConfig{48, 5},
                   BatchNorm1dConfig{Fields(5, 0.5)}};
  auto model = Model::Build(config, &b, 1);
  ASSERT_OK(model);
  std::vector<std::string> names;
  for (const NamedBuffer& nb : (*model)->buffers()) names.push_back(nb.name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"1.running_mean", "1.running_var", "1.num_batches_tracked",
                                      "5.running_mean", "5.running_var", "5.num_batches_tracked"}));
  names.clear();
  for (const NamedParameter& np : (*model)->parameters()) names.push_back(np.name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "1.weight", "1.bias", "4.weight", "4.bias",
                                             "5.weight", "5.bias"}));
  EXPECT_EQ(CountParameters(config), 2 * 3 * 9 + 6 + 48 * 5 + 5 + 10);

  // Pixels in [0, 1], as serving's FP32 inputs are.
  Tensor x = MakeTensor(b, {6, 2, 4, 4}, RandomValues(6 * 32, 60, 0, 1));
  for (int i = 0; i < 3; ++i) ASSERT_OK((*model)->Forward(x, Mode::kTrain).status());
  // Optimizers and ZeroGrad leave buffers alone.
  auto before = [&](Model& m) {
    std::vector<std::vector<float>> out;
    for (const NamedBuffer& nb : m.buffers()) {
      out.push_back(nb.buffer->kind == BufferKind::kF32
                        ? ToHost(b, nb.buffer->value)
                        : std::vector<float>{static_cast<float>(nb.buffer->count)});
    }
    return out;
  };
  const auto trained = before(**model);
  OptimizerConfig oc;
  oc.lr = 0.1f;
  oc.weight_decay = 0.1f;
  auto opt = Optimizer::Create(oc, &b, (*model)->parameters());
  ASSERT_OK(opt);
  ASSERT_OK((*model)->ZeroGrad());
  ASSERT_OK((*opt)->Step(0.1f));
  EXPECT_EQ(before(**model), trained);
  EXPECT_EQ(trained[2], std::vector<float>{3});

  TempDir dir;
  const std::string path = dir.file("bn.safetensors");
  ASSERT_OK(WriteCheckpoint(path, **model, nullptr, {}, {}));
  auto file = ReadSafetensors(path);
  ASSERT_OK(file);
  const HostTensor* count = file->Find("5.num_batches_tracked");
  ASSERT_NE(count, nullptr);
  EXPECT_EQ(count->dtype, SafetensorDType::kI64);
  EXPECT_EQ(count->shape, Shape{});
  int64_t value = 0;
  ASSERT_EQ(count->bytes.size(), 8u);
  std::memcpy(&value, count->bytes.data(), 8);
  EXPECT_EQ(value, 3);

  auto fresh = Model::Build(config, &b, 2);
  ASSERT_OK(fresh);
  ASSERT_OK(ReadCheckpoint(path, **fresh, nullptr, nullptr));
  EXPECT_EQ(before(**fresh), trained);
  auto out_a = (*model)->Forward(x, Mode::kEval);
  ASSERT_OK(out_a);
  const std::vector<float> ya = ToHost(b, **out_a);
  auto out_b = (*fresh)->Forward(x, Mode::kEval);
  ASSERT_OK(out_b);
  EXPECT_EQ(ToHost(b, **out_b), ya);

  // Without running_var the file does not load, and the model keeps what it had.
  SafetensorsContents partial = *file;
  std::erase_if(partial.tensors, [](const HostTensor& t) { return t.name == "1.running_var"; });
  ASSERT_OK(WriteSafetensors(dir.file("partial.safetensors"), partial.tensors, partial.metadata));
  auto other = Model::Build(config, &b, 3);
  ASSERT_OK(other);
  const auto untouched = before(**other);
  const absl::Status s = ReadCheckpoint(dir.file("partial.safetensors"), **other, nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("no tensor 1.running_var"), std::string::npos) << s;
  EXPECT_EQ(before(**other), untouched);

  // A counter of the wrong dtype is refused too.
  SafetensorsContents wrong = *file;
  for (HostTensor& t : wrong.tensors) {
    if (t.name == "1.num_batches_tracked") t = HostTensorFromI64(t.name, {3});
  }
  ASSERT_OK(WriteSafetensors(dir.file("wrong.safetensors"), wrong.tensors, wrong.metadata));
  const absl::Status w = ReadCheckpoint(dir.file("wrong.safetensors"), **other, nullptr, nullptr);
  EXPECT_NE(w.message().find("1.num_batches_tracked is I64 1 but the model needs an I64 scalar"),
            std::string::npos)
      << w;

  // Serving runs in evaluation mode with the running statistics: the session's probabilities
  // are the softmax of the trained model's evaluation logits.
  auto session = InferenceSession::FromCheckpoint(path, &b, 8);
  ASSERT_OK(session);
  // PixelNorm's defaults (x = u8 / 255): an FP32 input in [0, 1] is the model's input itself.
  const std::vector<float> pixels01 = ToHost(b, x);
  std::vector<float> probs(6 * 5);
  std::vector<int32_t> classes(6);
  ASSERT_OK((*session)->PredictF32(pixels01.data(), 6, probs.data(), classes.data()));
  for (int r = 0; r < 6; ++r) {
    double total = 0;
    for (int k = 0; k < 5; ++k) total += std::exp(static_cast<double>(ya[r * 5 + k]));
    for (int k = 0; k < 5; ++k) {
      EXPECT_NEAR(probs[r * 5 + k], std::exp(ya[r * 5 + k]) / total, 1e-5) << r << "," << k;
    }
  }
}

// Evaluation over more samples than cuDNN's batch-norm calls take at once (65,535) gives every
// sample the running statistics' formula. Training that many runs on the CPU, and on CUDA for
// (batch, features) by kiln's own kernels; through cuDNN (a length, spatial 2) it is refused,
// naming the limit.
TEST_P(BatchNormTest, BatchesOverCudnnsLimitEvaluateInFullAndTrainOnlyWhereTheyCan) {
  const int batch = 70000, channels = 3;
  for (int64_t spatial : {int64_t{1}, int64_t{2}}) {
    SCOPED_TRACE(::testing::Message() << "spatial " << spatial);
    const BatchNormGeometry g{batch, channels, spatial};
    const std::vector<float> x = RandomValues(int64_t{batch} * channels * spatial, 71);
    const std::vector<float> gamma = {1.5f, -0.5f, 2.0f}, beta = {0.1f, 0.2f, -0.3f};
    const std::vector<float> mean = {0.05f, -0.1f, 0.2f}, var = {0.9f, 1.1f, 0.5f};
    auto upload = [&](const std::vector<float>& v) {
      return MakeTensor(*backend_, {static_cast<int64_t>(v.size())}, v);
    };
    Tensor tx = upload(x), tg = upload(gamma), tb = upload(beta), tm = upload(mean),
           tv = upload(var), ty = upload(std::vector<float>(x.size(), 0.0f));
    ASSERT_OK(backend_->BatchNormForwardInference(g, 1e-5, tx.f32(), tg.f32(), tb.f32(),
                                                  tm.f32(), tv.f32(), ty.f32()));
    const std::vector<float> y = ToHost(*backend_, ty);
    int64_t wrong = 0;
    for (size_t k = 0; k < x.size(); ++k) {
      const int c = static_cast<int>((static_cast<int64_t>(k) / spatial) % channels);
      const double want = (x[k] - mean[c]) / std::sqrt(var[c] + 1e-5) * gamma[c] + beta[c];
      if (!(std::abs(y[k] - want) < 1e-5 * std::max(1.0, std::abs(want)))) ++wrong;
    }
    EXPECT_EQ(wrong, 0) << "of " << x.size() << " values";

    Tensor saved_mean = upload(mean), saved_invstd = upload(var);
    const absl::Status train = backend_->BatchNormForwardTraining(
        g, 1e-5, 0.1, tx.f32(), tg.f32(), tb.f32(), ty.f32(), tm.f32(), tv.f32(),
        saved_mean.f32(), saved_invstd.f32());
    if (GetParam() == "cpu" || spatial == 1) {
      EXPECT_OK(train);
    } else {
      EXPECT_EQ(train.code(), absl::StatusCode::kInvalidArgument) << train;
      EXPECT_THAT(std::string(train.message()), ::testing::HasSubstr("limit of 65535"));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryBackend, BatchNormTest, ::testing::Values("cpu", "cuda:0"),
                         testing::DeviceParamName);

// Writes a trained conv-bn-relu-linear-bn1d checkpoint (with SGD momentum state) and an evaluation
// batch with kiln's outputs for tests/engine/batchnorm_torch_check.py, which loads the checkpoint
// into torch.nn.Sequential with strict=True where PyTorch is installed (and into its own pure
// Python forward pass everywhere) and compares the outputs:
//   dir=$(mktemp -d)
//   KILN_BATCHNORM_TORCH_DIR="$dir" engine_tests --gtest_filter='BatchNormTorchInterop.*'
//   tests/engine/batchnorm_torch_check.py "$dir"
// ctest runs both as engine_batchnorm_torch_interop.
TEST(BatchNormTorchInterop, WritesACheckpointAndEvaluationOutputsForTorch) {
  const char* dir = std::getenv("KILN_BATCHNORM_TORCH_DIR");
  if (dir == nullptr) GTEST_SKIP() << "KILN_BATCHNORM_TORCH_DIR not set";
  auto backend = CreateBackend("cpu", {2});
  ASSERT_OK(backend);
  Backend& b = **backend;
  ModelConfig config;
  config.input_shape = {3, 5, 5};
  config.layers = {Conv2dConfig{3, 4, 3, 1, 1, false},
                   BatchNorm2dConfig{Fields(4, 0.2)},
                   ReluConfig{},
                   FlattenConfig{},
                   LinearConfig{100, 6},
                   BatchNorm1dConfig{Fields(6, 0.1, 1e-3)}};
  auto model = Model::Build(config, &b, 4);
  ASSERT_OK(model);
  // Scales and shifts away from ones and zeros, and running statistics moved by a few batches.
  uint32_t seed = 100;
  for (const NamedParameter& p : (*model)->parameters()) {
    if (p.name.find("weight") == std::string::npos || p.param->value.rank() != 1) continue;
    const std::vector<float> v = RandomValues(p.param->value.numel(), ++seed, 0.5f, 1.5f);
    ASSERT_OK(b.CopyFromHost(v.data(), v.size() * 4, &p.param->value));
  }
  for (int step = 0; step < 3; ++step) {
    Tensor x = MakeTensor(b, {8, 3, 5, 5}, RandomValues(8 * 75, 110 + step, -1, 2));
    auto out = (*model)->Forward(x, Mode::kTrain);
    ASSERT_OK(out);
    Tensor dout = MakeTensor(b, {8, 6}, RandomValues(48, 120 + step));
    ASSERT_OK((*model)->Backward(dout));
  }
  OptimizerConfig oc;
  oc.lr = 0.1f;
  oc.momentum = 0.9f;
  auto opt = Optimizer::Create(oc, &b, (*model)->parameters());
  ASSERT_OK(opt);
  ASSERT_OK((*opt)->Step(0.1f));
  ASSERT_OK(WriteCheckpoint(std::string(dir) + "/model.safetensors", **model, opt->get(), {}, {}));
  const std::vector<float> xv = RandomValues(5 * 75, 130, -2, 2);
  Tensor x = MakeTensor(b, {5, 3, 5, 5}, xv);
  auto out = (*model)->Forward(x, Mode::kEval);
  ASSERT_OK(out);
  const std::vector<float> yv = ToHost(b, **out);
  ASSERT_OK(WriteSafetensors(std::string(dir) + "/eval.safetensors",
                             {HostTensorFromF32("input", xv.data(), {5, 3, 5, 5}),
                              HostTensorFromF32("output", yv.data(), {5, 6})},
                             {}));
}

TEST(BatchNormShapes, RulesNameTheLayerAndTheProblem) {
  auto error = [](const ModelConfig& c) {
    auto s = InferShapes(c);
    return s.ok() ? std::string("ok") : std::string(s.status().message());
  };
  ModelConfig c;
  c.input_shape = {4, 6, 6};
  c.layers = {ReluConfig{}, BatchNorm2dConfig{Fields(8)}};
  EXPECT_EQ(error(c), "layer 1 batchnorm2d: num_features 8 but input is 4x6x6 (4 channels)");
  c.layers = {BatchNorm1dConfig{Fields(4)}};
  EXPECT_EQ(error(c),
            "layer 0 batchnorm1d: needs an F or CxL input but input is 4x6x6 (use batchnorm2d "
            "for CxHxW)");
  c.layers = {BatchNorm2dConfig{Fields(4, 1.5)}};
  EXPECT_EQ(error(c), "layer 0 batchnorm2d: momentum must be in [0, 1], got 1.5");
  c.layers = {BatchNorm2dConfig{Fields(4, 0.1, 0)}};
  EXPECT_EQ(error(c), "layer 0 batchnorm2d: eps must be > 0, got 0");
  c.layers = {BatchNorm2dConfig{Fields(0)}};
  EXPECT_EQ(error(c), "layer 0 batchnorm2d: num_features must be positive, got 0");
  c.input_shape = {10};
  c.layers = {BatchNorm2dConfig{Fields(10)}};
  EXPECT_EQ(error(c), "layer 0 batchnorm2d: batchnorm2d needs a CxHxW input but input is 10");
  c.layers = {BatchNorm1dConfig{Fields(10)}};
  EXPECT_EQ(error(c), "ok");
  c.input_shape = {10, 7};
  EXPECT_EQ(error(c), "ok");
}

TEST(BatchNormShapes, JsonRoundTripKeepsEveryField) {
  ModelConfig c;
  c.input_shape = {3, 8, 8};
  BatchNorm2dConfig bn2d;
  bn2d.num_features = 3;
  bn2d.eps = 1e-3;
  bn2d.momentum = 0.25;
  bn2d.affine = false;
  c.layers = {bn2d, FlattenConfig{}, BatchNorm1dConfig{Fields(192)}};
  auto back = ModelConfigFromJson(ModelConfigToJson(c));
  ASSERT_OK(back);
  ASSERT_EQ(back->layers.size(), 3u);
  const auto& a = std::get<BatchNorm2dConfig>(back->layers[0]);
  EXPECT_EQ(a.num_features, 3);
  EXPECT_EQ(a.eps, 1e-3);
  EXPECT_EQ(a.momentum, 0.25);
  EXPECT_FALSE(a.affine);
  const auto& d = std::get<BatchNorm1dConfig>(back->layers[2]);
  EXPECT_EQ(d.num_features, 192);
  EXPECT_EQ(d.eps, 1e-5);
  EXPECT_EQ(d.momentum, 0.1);
  EXPECT_TRUE(d.affine);
  // Defaults when only the type and size are given, and a clear error for a wrong type.
  auto defaults = ModelConfigFromJson(
      R"({"input_shape":[4],"layers":[{"type":"batchnorm1d","num_features":4}]})");
  ASSERT_OK(defaults);
  EXPECT_EQ(std::get<BatchNorm1dConfig>(defaults->layers[0]).eps, 1e-5);
  auto bad = ModelConfigFromJson(
      R"({"input_shape":[4],"layers":[{"type":"batchnorm1d","num_features":4,"eps":"x"}]})");
  EXPECT_EQ(bad.status().message(), "layer 0 batchnorm1d: eps must be a number");
}

// The CPU's sums run per channel on one thread in a fixed order: the same bits on any number of
// threads.
TEST(BatchNormCpu, SameBitsOnOneAndTwoThreads) {
  const BatchNormGeometry g{64, 32, 16 * 16};
  const int64_t n = int64_t{g.batch} * g.channels * g.spatial;
  const std::vector<float> xv = RandomValues(n, 70, -2, 3), dyv = RandomValues(n, 71);
  std::vector<std::vector<float>> results[2];
  for (int threads : {1, 2}) {
    auto b = CreateBackend("cpu", {threads});
    ASSERT_OK(b);
    Backend& be = **b;
    Tensor x = MakeTensor(be, {n}, xv), dy = MakeTensor(be, {n}, dyv);
    Tensor gamma = MakeTensor(be, {32}, RandomValues(32, 72));
    Tensor beta = MakeTensor(be, {32}, RandomValues(32, 73));
    Tensor rm = MakeTensor(be, {32}, std::vector<float>(32, 0.0f));
    Tensor rv = MakeTensor(be, {32}, std::vector<float>(32, 1.0f));
    Tensor sm = MakeTensor(be, {32}, std::vector<float>(32, 0.0f));
    Tensor si = MakeTensor(be, {32}, std::vector<float>(32, 0.0f));
    Tensor dg = MakeTensor(be, {32}, std::vector<float>(32, 0.0f));
    Tensor db = MakeTensor(be, {32}, std::vector<float>(32, 0.0f));
    auto y = be.Allocate(DType::kF32, {n});
    auto dx = be.Allocate(DType::kF32, {n});
    ASSERT_OK(be.BatchNormForwardTraining(g, 1e-5, 0.1, x.f32(), gamma.f32(), beta.f32(), y->f32(),
                                          rm.f32(), rv.f32(), sm.f32(), si.f32()));
    ASSERT_OK(be.BatchNormBackward(g, 1e-5, x.f32(), gamma.f32(), sm.f32(), si.f32(), dy.f32(),
                                   dg.f32(), db.f32(), dx->f32()));
    for (const Tensor* t : {&*y, &rm, &rv, &*dx, &dg, &db}) {
      results[threads - 1].push_back(ToHost(be, *t));
    }
  }
  EXPECT_EQ(results[0], results[1]);
}

// CUDA (cuDNN) against the CPU on the same inputs: every output of the three passes.
TEST(BatchNormParity, CudaMatchesCpu) {
  const std::string absent = testing::AbsentDeviceReason("cuda:0");
  if (!absent.empty()) GTEST_SKIP() << absent;
  for (const BatchNormGeometry& g :
       {BatchNormGeometry{8, 16, 9 * 7}, BatchNormGeometry{32, 10, 1}, BatchNormGeometry{3, 4, 5},
        BatchNormGeometry{64, 32, 16 * 16}}) {
    const int64_t n = int64_t{g.batch} * g.channels * g.spatial;
    const int c = g.channels;
    const std::vector<float> xv = RandomValues(n, 80, -2, 3), dyv = RandomValues(n, 81);
    std::vector<std::vector<float>> out[2];
    int slot = 0;
    for (const char* device : {"cpu", "cuda:0"}) {
      auto b = CreateBackend(device, {2});
      ASSERT_OK(b) << b.status();
      Backend& be = **b;
      Tensor x = MakeTensor(be, {n}, xv), dy = MakeTensor(be, {n}, dyv);
      Tensor gamma = MakeTensor(be, {c}, RandomValues(c, 82, 0.5f, 1.5f));
      Tensor beta = MakeTensor(be, {c}, RandomValues(c, 83));
      Tensor rm = MakeTensor(be, {c}, RandomValues(c, 84));
      Tensor rv = MakeTensor(be, {c}, RandomValues(c, 85, 0.5f, 2.0f));
      Tensor sm = MakeTensor(be, {c}, std::vector<float>(c, 0.0f));
      Tensor si = MakeTensor(be, {c}, std::vector<float>(c, 0.0f));
      Tensor dg = MakeTensor(be, {c}, std::vector<float>(c, 0.5f));
      Tensor db = MakeTensor(be, {c}, std::vector<float>(c, -0.5f));
      auto y = be.Allocate(DType::kF32, {n});
      auto ye = be.Allocate(DType::kF32, {n});
      auto dx = be.Allocate(DType::kF32, {n});
      ASSERT_OK(be.BatchNormForwardInference(g, 1e-5, x.f32(), gamma.f32(), beta.f32(), rm.f32(),
                                             rv.f32(), ye->f32()));
      ASSERT_OK(be.BatchNormForwardTraining(g, 1e-5, 0.1, x.f32(), gamma.f32(), beta.f32(),
                                            y->f32(), rm.f32(), rv.f32(), sm.f32(), si.f32()));
      ASSERT_OK(be.BatchNormBackward(g, 1e-5, x.f32(), gamma.f32(), sm.f32(), si.f32(), dy.f32(),
                                     dg.f32(), db.f32(), dx->f32()));
      for (const Tensor* t : {&*ye, &*y, &rm, &rv, &sm, &si, &*dx, &dg, &db}) {
        out[slot].push_back(ToHost(be, *t));
      }
      ++slot;
    }
    const char* names[] = {"eval y",       "y",  "running_mean", "running_var", "saved_mean",
                           "saved_invstd", "dx", "dgamma",       "dbeta"};
    for (size_t k = 0; k < out[0].size(); ++k) {
      for (size_t i = 0; i < out[0][k].size(); ++i) {
        const double want = out[0][k][i];
        ASSERT_NEAR(out[1][k][i], want, 1e-4 * std::max(1.0, std::abs(want)))
            << names[k] << "[" << i << "] of " << g.batch << "x" << g.channels << "x" << g.spatial;
      }
    }
  }
}

}  // namespace
}  // namespace kiln
