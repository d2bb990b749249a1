// The writer for tests/engine/gpt_torch_check.py: a briefly trained character GPT (nanoGPT's
// layout, lm_head tied to wte) as a kiln checkpoint, and token windows with kiln's logits and loss
// on them, for the check to load into the PyTorch peer's GPT module and compare:
//   dir=$(mktemp -d)
//   KILN_GPT_TORCH_DIR="$dir" engine_tests --gtest_filter='GptTorchInterop.*'
//   tests/engine/gpt_torch_check.py "$dir"
// ctest runs both as engine_gpt_torch_interop.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backend_registry.h"
#include "engine/model/checkpoint.h"
#include "engine/loss.h"
#include "engine/model/model.h"
#include "engine/optim/optimizer.h"
#include "engine/model/safetensors.h"
#include "tests/engine/gpt_config.h"
#include "tests/engine/test_util.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

constexpr int64_t kVocab = 11, kBlock = 16, kBatch = 3;

// Random ids in [0, kVocab) for `batch` windows of kBlock + 1 tokens: x is each window's first
// kBlock, y its last kBlock (the next token at every position), as the peer's batches.
void Windows(int batch, uint32_t seed, std::vector<int32_t>* x, std::vector<int32_t>* y) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> id(0, kVocab - 1);
  x->clear();
  y->clear();
  for (int b = 0; b < batch; ++b) {
    std::vector<int32_t> w(kBlock + 1);
    for (int32_t& v : w) v = id(gen);
    x->insert(x->end(), w.begin(), w.end() - 1);
    y->insert(y->end(), w.begin() + 1, w.end());
  }
}

Tensor IdTensor(Backend& b, const std::vector<int32_t>& ids) {
  auto t = b.Allocate(DType::kI32, {static_cast<int64_t>(ids.size()) / kBlock, kBlock});
  EXPECT_OK(t);
  EXPECT_OK(b.CopyFromHost(ids.data(), ids.size() * sizeof(int32_t), &*t));
  return *t;
}

HostTensor I32Tensor(const std::string& name, const std::vector<int32_t>& v, const Shape& shape) {
  HostTensor t{name, SafetensorDType::kI32, shape, std::vector<uint8_t>(v.size() * 4)};
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

// DIR/model.safetensors: a 2-layer, 4-head, 32-wide GPT with the gpt2 init, trained 8 AdamW steps
// so that biases and layer norms leave their initial zeros and ones, with a vocabulary.
// DIR/windows.safetensors: x, y (I32 [3, 16]), kiln's eval logits (F32 [3, 16, 11]) and loss
// (F32 [1], the mean cross-entropy over every position); its metadata "parameters" is kiln's
// parameter count.
TEST(GptTorchInterop, WritesATrainedGptCheckpointAndItsLossOnWindows) {
  const char* dir = std::getenv("KILN_GPT_TORCH_DIR");
  if (dir == nullptr) GTEST_SKIP() << "KILN_GPT_TORCH_DIR not set";
  auto backend = CreateBackend("cpu", {2});
  ASSERT_OK(backend);
  Backend& b = **backend;
  ModelConfig config = testing::GptConfig({kVocab, kBlock, 2, 4, 32, /*tied=*/true});
  config.init = InitRule::kGpt2;
  auto model = Model::Build(config, &b, 3);
  ASSERT_OK(model) << model.status();
  OptimizerConfig oc;
  oc.kind = OptimizerConfig::Kind::kAdamW;
  oc.weight_decay = 0.1f;
  oc.decay_rule = OptimizerConfig::DecayRule::kMatrices;
  auto opt = Optimizer::Create(oc, &b, (*model)->parameters());
  ASSERT_OK(opt);
  Loss loss(LossKind::kCrossEntropy, &b);
  auto scalar = b.Allocate(DType::kF32, {1});
  auto correct = b.Allocate(DType::kI32, {1});
  auto dz = b.Allocate(DType::kF32, {8, kBlock, kVocab});
  ASSERT_TRUE(scalar.ok() && correct.ok() && dz.ok());
  std::vector<int32_t> x, y;
  for (int step = 0; step < 8; ++step) {
    Windows(8, 40 + step, &x, &y);
    // The model reads its input again in Backward: the ids live until then.
    const Tensor ids = IdTensor(b, x), targets = IdTensor(b, y);
    auto out = (*model)->Forward(ids, Mode::kTrain);
    ASSERT_OK(out);
    ASSERT_OK(loss.Compute(**out, targets, scalar->f32(), correct->i32(), &*dz));
    ASSERT_OK((*model)->ZeroGrad());
    ASSERT_OK((*model)->Backward(*dz));
    ASSERT_OK((*opt)->Step(1e-2f));
  }
  std::string vocabulary = "[";
  for (int64_t i = 0; i < kVocab; ++i) {
    absl::StrAppend(&vocabulary, i ? ", " : "", "\"", std::string(1, 'a' + i), "\"");
  }
  vocabulary += "]";
  ASSERT_OK(WriteCheckpoint(std::string(dir) + "/model.safetensors", **model, opt->get(),
                            TrainingPosition{}, PixelNorm{}, vocabulary));

  Windows(kBatch, 7, &x, &y);
  const Tensor ids = IdTensor(b, x);
  auto logits = (*model)->Forward(ids, Mode::kEval);
  ASSERT_OK(logits);
  const std::vector<float> logits_v = testing::ToHost(b, **logits);
  ASSERT_OK(loss.Compute(**logits, IdTensor(b, y), scalar->f32(), correct->i32(), nullptr));
  const std::vector<float> loss_v = testing::ToHost(b, *scalar);
  ASSERT_OK(
      WriteSafetensors(std::string(dir) + "/windows.safetensors",
                       {I32Tensor("x", x, {kBatch, kBlock}), I32Tensor("y", y, {kBatch, kBlock}),
                        HostTensorFromF32("logits", logits_v.data(), {kBatch, kBlock, kVocab}),
                        HostTensorFromF32("loss", loss_v.data(), {1})},
                       {{"parameters", absl::StrCat((*model)->parameter_count())}}));
  std::printf("kiln loss on %lld windows: %.6f\n", static_cast<long long>(kBatch), loss_v[0]);
}

}  // namespace
}  // namespace kiln
