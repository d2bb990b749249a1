// Incremental decoding (Model::ForwardAt with a KV cache) against the whole-sequence forward, and
// generation (engine/generation.h): greedy and seeded sampling with and without the cache, top-k,
// the crop past the context, early stops, and every refused parameter. Over every backend
// ("cpu", "cuda:0"); a backend not present here skips, saying why.
#include "engine/generation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend_registry.h"
#include "engine/model/model.h"
#include "engine/model/model_config_json.h"
#include "tests/engine/gpt_config.h"
#include "tests/engine/test_util.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

using testing::GptConfig;
using testing::GptShape;
using testing::ToHost;

constexpr int kVocab = 11, kBlock = 16;
constexpr float kLogitTolerance = 1e-5f;

// The brief's small random GPT: 2 layers, n_embd 32, 2 heads, block 16, vocab 11.
ModelConfig SmallGpt() { return GptConfig({kVocab, kBlock, 2, 2, 32}); }

// Random token ids in [0, kVocab).
std::vector<int32_t> RandomTokens(size_t n, uint32_t seed) {
  std::vector<int32_t> out;
  Rng rng(seed);
  for (size_t i = 0; i < n; ++i) out.push_back(static_cast<int32_t>(rng.Below(kVocab)));
  return out;
}

// The message of a status, for substring checks.
std::string Message(const absl::Status& s) { return std::string(s.message()); }

class Generation : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string absent = testing::AbsentDeviceReason(GetParam());
    if (!absent.empty()) GTEST_SKIP() << absent;
    auto b = CreateBackend(GetParam(), {2});
    ASSERT_OK(b) << b.status();
    backend_ = std::move(*b);
    auto m = Model::Build(SmallGpt(), backend_.get(), /*seed=*/7);
    ASSERT_OK(m) << m.status();
    model_ = std::move(*m);
  }

  Tensor Ids(const std::vector<int32_t>& ids) {
    auto t = backend_->Allocate(DType::kI32, {1, static_cast<int64_t>(ids.size())});
    EXPECT_OK(t);
    EXPECT_OK(backend_->CopyFromHost(ids.data(), ids.size() * sizeof(int32_t), &*t));
    return *t;
  }

  // Model::Forward over a whole block of ids: (block, vocab) logits on the host.
  std::vector<float> WholeForward(const std::vector<int32_t>& block) {
    Tensor ids = Ids(block);
    auto out = model_->Forward(ids, Mode::kEval);
    EXPECT_OK(out);
    return out.ok() ? ToHost(*backend_, **out) : std::vector<float>();
  }

  // Greedy generation written out with Model::Forward alone, cropping as nanoGPT does: each step
  // runs the last min(n, block) tokens (padded with 0 after them) and takes the argmax of the
  // context's last row.
  std::vector<int32_t> GreedyByHand(std::vector<int32_t> tokens, int steps) {
    std::vector<int32_t> out;
    for (int s = 0; s < steps; ++s) {
      const size_t n = std::min<size_t>(tokens.size(), kBlock);
      std::vector<int32_t> block(kBlock, 0);
      std::copy(tokens.end() - static_cast<std::ptrdiff_t>(n), tokens.end(), block.begin());
      const std::vector<float> z = WholeForward(block);
      const float* row = z.data() + (n - 1) * kVocab;
      const int32_t next = static_cast<int32_t>(std::max_element(row, row + kVocab) - row);
      tokens.push_back(next);
      out.push_back(next);
    }
    return out;
  }

  std::vector<int32_t> MustGenerate(const std::vector<int32_t>& prompt, GenerationParams p) {
    auto out = Generate(model_.get(), prompt, p);
    EXPECT_OK(out) << out.status();
    return out.ok() ? *out : std::vector<int32_t>();
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
};

TEST_P(Generation, CachedLogitsEqualTheWholeForwardsAtEveryPosition) {
  const std::vector<int32_t> seq = RandomTokens(kBlock, 3);
  const std::vector<float> want = WholeForward(seq);  // row p: the logits after seq[0..p]
  auto state = model_->NewDecodeState();
  ASSERT_OK(state) << state.status();
  EXPECT_EQ((*state)->capacity(), kBlock);
  // A prefill of 5, single tokens, a chunk of 4 after them (new queries at an offset), then
  // single tokens to the end of the block.
  const std::vector<int> chunks = {5, 1, 1, 1, 4, 1, 1, 1, 1};
  size_t p = 0;
  for (int n : chunks) {
    SCOPED_TRACE(::testing::Message() << "positions " << p << ".." << p + n - 1);
    ASSERT_EQ((*state)->length(), static_cast<int64_t>(p));
    std::vector<int32_t> part(seq.begin() + p, seq.begin() + p + n);
    Tensor ids = Ids(part);
    auto out = model_->ForwardAt(ids, state->get());
    ASSERT_OK(out) << out.status();
    ASSERT_EQ((*out)->shape(), (Shape{1, n, kVocab}));
    const std::vector<float> got = ToHost(*backend_, **out);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[p * kVocab + i], kLogitTolerance) << "logit " << i;
    }
    p += n;
  }
  ASSERT_EQ(p, seq.size());
  // A full cache takes no more; after Reset the same state prefills again.
  Tensor one = Ids({1});
  auto full = model_->ForwardAt(one, state->get());
  ASSERT_FALSE(full.ok());
  EXPECT_NE(Message(full.status()).find("exceed the model's sequence length 16"), std::string::npos)
      << full.status();
  EXPECT_EQ((*state)->length(), kBlock) << "a refused call leaves the state as it was";
  (*state)->Reset();
  EXPECT_EQ((*state)->length(), 0);
  Tensor again = Ids(seq);
  auto out = model_->ForwardAt(again, state->get());
  ASSERT_OK(out);
  const std::vector<float> got = ToHost(*backend_, **out);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], kLogitTolerance) << i;
}

TEST_P(Generation, GreedyIsTheSameWithAndWithoutTheCacheAndCropsPastTheBlock) {
  const std::vector<int32_t> prompt = {1, 2, 3};
  GenerationParams p;
  p.max_tokens = 40;  // past the block of 16: the context is cropped
  p.temperature = 0;
  const std::vector<int32_t> want = GreedyByHand(prompt, 40);
  p.use_kv_cache = true;
  EXPECT_EQ(MustGenerate(prompt, p), want);
  p.use_kv_cache = false;
  EXPECT_EQ(MustGenerate(prompt, p), want);
}

TEST_P(Generation, APromptOfAWholeBlockGeneratesAfterIt) {
  const std::vector<int32_t> prompt = RandomTokens(kBlock, 5);
  GenerationParams p;
  p.max_tokens = 3;
  p.temperature = 0;
  EXPECT_EQ(MustGenerate(prompt, p), GreedyByHand(prompt, 3));
}

TEST_P(Generation, SeededSamplingRepeatsWithAndWithoutTheCacheAndSeedsDiffer) {
  const std::vector<int32_t> prompt = {4};
  GenerationParams p;
  p.max_tokens = 40;
  p.temperature = 1.5;  // flat enough that two seeds part within 40 tokens
  p.seed = 1;
  const std::vector<int32_t> first = MustGenerate(prompt, p);
  ASSERT_EQ(first.size(), 40u);
  EXPECT_EQ(MustGenerate(prompt, p), first);
  p.use_kv_cache = false;
  EXPECT_EQ(MustGenerate(prompt, p), first);
  p.use_kv_cache = true;
  p.seed = 2;
  EXPECT_NE(MustGenerate(prompt, p), first);
}

TEST_P(Generation, TopKOfOneIsGreedy) {
  const std::vector<int32_t> prompt = {5, 6};
  GenerationParams greedy;
  greedy.max_tokens = 20;
  greedy.temperature = 0;
  GenerationParams top1 = greedy;
  top1.temperature = 0.8;
  top1.top_k = 1;
  top1.seed = 99;
  EXPECT_EQ(MustGenerate(prompt, top1), MustGenerate(prompt, greedy));
}

TEST_P(Generation, TheCallbackSeesEachTokenAndStopsEarly) {
  std::vector<int32_t> seen;
  GenerationParams p;
  p.max_tokens = 10;
  auto out = Generate(model_.get(), {1}, p, [&](int32_t token) {
    seen.push_back(token);
    return seen.size() < 3;
  });
  ASSERT_OK(out) << out.status();
  EXPECT_EQ(out->size(), 3u);
  EXPECT_EQ(*out, seen);
}

TEST_P(Generation, BadParametersAreRefusedNamingTheBounds) {
  struct Case {
    std::vector<int32_t> prompt;
    GenerationParams params;
    std::string message;
  };
  auto with = [](auto set) {
    GenerationParams p;
    set(p);
    return p;
  };
  const std::vector<Case> cases = {
      {{}, {}, "the prompt is empty"},
      {std::vector<int32_t>(17, 1), {}, "the prompt has 17 tokens but the model's context"},
      {{1, 11}, {}, "prompt token 1 is 11, outside the model's token ids 0..10"},
      {{1, -1}, {}, "prompt token 1 is -1"},
      {{1}, with([](auto& p) { p.max_tokens = 0; }), "max_tokens must be in 1..1024"},
      {{1}, with([](auto& p) { p.max_tokens = 1025; }), "got 1025"},
      {{1}, with([](auto& p) { p.temperature = -0.5; }), "temperature must be finite and >= 0"},
      {{1}, with([](auto& p) { p.temperature = NAN; }), "temperature must be finite"},
      {{1}, with([](auto& p) { p.temperature = INFINITY; }), "temperature must be finite"},
      {{1}, with([](auto& p) { p.top_k = -1; }), "top_k must be in 0..11"},
      {{1}, with([](auto& p) { p.top_k = 12; }), "got 12"},
  };
  for (const Case& c : cases) {
    auto out = Generate(model_.get(), c.prompt, c.params);
    ASSERT_FALSE(out.ok()) << c.message;
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(Message(out.status()).find(c.message), std::string::npos)
        << out.status() << " lacks: " << c.message;
  }
  EXPECT_FALSE(Generate(nullptr, {1}, {}).ok());
}

TEST_P(Generation, AModelThatIsNotASequenceModelIsRefusedSayingWhatItTakes) {
  auto mlp = Model::Build(MnistMlpConfig(), backend_.get(), 1);
  ASSERT_OK(mlp);
  auto out = Generate(mlp->get(), {1}, {});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(Message(out.status()).find("a sequence model reads T int32 token ids"), std::string::npos);
  EXPECT_NE(Message(out.status()).find("this model takes 784 floats"), std::string::npos)
      << out.status();
  EXPECT_FALSE((*mlp)->NewDecodeState().ok());
  // Token ids in, but a classifier over the whole sequence out.
  auto config = ModelConfigFromJson(R"({"input_shape": [4], "layers": [
      {"type": "embedding", "num_embeddings": 5, "embedding_dim": 3},
      {"type": "flatten"}, {"type": "linear", "in_features": 12, "out_features": 2}]})");
  ASSERT_OK(config) << config.status();
  auto shape = SequenceModelShapeOf(*config);
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(Message(shape.status()).find("this model gives 2 for 4 token ids"), std::string::npos)
      << shape.status();
}

TEST_P(Generation, ALayerThatMixesPositionsIsNamedAndRefusedWithAndWithoutTheCache) {
  // Per-position shapes throughout, but batchnorm1d over (C=T, L=d) mixes the positions.
  auto config = ModelConfigFromJson(R"({"input_shape": [4], "layers": [
      {"type": "embedding", "num_embeddings": 5, "embedding_dim": 3},
      {"type": "batchnorm1d", "num_features": 4, "name": "mixer"},
      {"type": "linear", "in_features": 3, "out_features": 5}]})");
  ASSERT_OK(config) << config.status();
  ASSERT_OK(SequenceModelShapeOf(*config).status());
  auto model = Model::Build(*config, backend_.get(), 1);
  ASSERT_OK(model) << model.status();
  auto state = (*model)->NewDecodeState();
  ASSERT_FALSE(state.ok());
  EXPECT_NE(Message(state.status())
                .find("node mixer: batchnorm1d cannot run over a sequence's "
                      "new positions alone"),
            std::string::npos)
      << state.status();
  // Without the cache too: the padding after the context would leak into it.
  for (bool cached : {true, false}) {
    GenerationParams p;
    p.use_kv_cache = cached;
    auto out = Generate(model->get(), {1}, p);
    ASSERT_FALSE(out.ok());
    EXPECT_NE(Message(out.status()).find("node mixer: batchnorm1d"), std::string::npos)
        << out.status();
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, Generation, ::testing::Values("cpu", "cuda:0"),
                         testing::DeviceParamName);

// The same weights (Model::Build draws them on the host) and seed on the CPU and on CUDA: the
// same tokens, sampled and greedy, with the cache. Skips without a GPU.
TEST(GenerationAcrossBackends, TheSameSeedGivesTheSameTokensOnCpuAndCuda) {
  const std::string absent = testing::AbsentDeviceReason("cuda:0");
  if (!absent.empty()) GTEST_SKIP() << absent;
  std::vector<std::vector<int32_t>> out;
  for (const char* device : {"cpu", "cuda:0"}) {
    auto backend = CreateBackend(device, {2});
    ASSERT_OK(backend) << backend.status();
    auto model = Model::Build(SmallGpt(), backend->get(), 7);
    ASSERT_OK(model) << model.status();
    for (double temperature : {0.0, 1.0}) {
      GenerationParams p;
      p.max_tokens = 24;  // past the block of 16
      p.temperature = temperature;
      p.top_k = 5;
      p.seed = 77;
      auto tokens = Generate(model->get(), {2, 3}, p);
      ASSERT_OK(tokens) << device << ": " << tokens.status();
      out.push_back(*tokens);
    }
  }
  EXPECT_EQ(out[0], out[2]) << "greedy";
  EXPECT_EQ(out[1], out[3]) << "sampled";
}

// --- the sampling rule alone -------------------------------------------------------------------

TEST(SampleToken, TemperatureZeroTakesTheFirstLargest) {
  const std::vector<float> z = {0.5f, 2.0f, -1.0f, 2.0f};
  for (uint64_t draw = 0; draw < 5; ++draw) EXPECT_EQ(SampleToken(z.data(), 4, 0, 0, 9, draw), 1);
}

TEST(SampleToken, TopKKeepsTheLargestAndThoseTiedWithTheKth) {
  const std::vector<float> z = {1.0f, 3.0f, 2.0f, 2.0f, 0.0f};
  std::vector<int> count(5, 0);
  for (uint64_t draw = 0; draw < 2000; ++draw) ++count[SampleToken(z.data(), 5, 1.0, 2, 4, draw)];
  EXPECT_EQ(count[0], 0);
  EXPECT_EQ(count[4], 0);
  EXPECT_GT(count[2], 0) << "tied with the 2nd largest, so kept";
  EXPECT_GT(count[3], 0) << "tied with the 2nd largest, so kept";
}

TEST(SampleToken, DrawsFollowTheSoftmaxOverTheTemperature) {
  // softmax of (0, ln 3) is (1/4, 3/4); at temperature 2 it is (1/(1+sqrt 3), sqrt 3/(1+sqrt 3)).
  const std::vector<float> z = {0.0f, std::log(3.0f)};
  for (double temperature : {1.0, 2.0}) {
    const double want = 1.0 / (1.0 + std::pow(3.0, 1.0 / temperature));
    int zeros = 0;
    const int n = 20000;
    for (int draw = 0; draw < n; ++draw) {
      zeros += SampleToken(z.data(), 2, temperature, 0, 5, static_cast<uint64_t>(draw)) == 0;
    }
    EXPECT_NEAR(static_cast<double>(zeros) / n, want, 0.015) << "temperature " << temperature;
  }
}

TEST(SampleToken, TheSameSeedAndDrawGiveTheSameToken) {
  const std::vector<float> z = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f};
  for (uint64_t draw = 0; draw < 50; ++draw) {
    EXPECT_EQ(SampleToken(z.data(), 7, 1.0, 0, 123, draw),
              SampleToken(z.data(), 7, 1.0, 0, 123, draw));
  }
}

}  // namespace
}  // namespace kiln
