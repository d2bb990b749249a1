// A language model trained on token windows (Trainer::Create with a TokenDataset): the loss
// falls, a resumed run is the uninterrupted one bit for bit, accumulation and clipping do what
// nanoGPT's do, and data that does not fit is refused naming what is wrong.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/backend_registry.h"
#include "engine/model/checkpoint.h"
#include "engine/data/token_data.h"
#include "engine/model/model.h"
#include "engine/model/sequence_model.h"
#include "engine/trainer.h"
#include "tests/engine/gpt_config.h"
#include "tests/engine/test_util.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

using testing::GptConfig;
using testing::TempDir;
using testing::ToHost;

// A corpus with structure a small model learns quickly: a few phrases in a seeded order.
std::string Corpus(int chars) {
  const char* phrases[] = {"the cat sat. ", "a dog ran! ", "we go home? ", "sun and sea; "};
  std::string text;
  uint64_t x = 12345;
  while (static_cast<int>(text.size()) < chars) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    text += phrases[(x >> 33) % 4];
  }
  return text;
}

class TokenTrainer : public ::testing::Test {
 protected:
  void SetUp() override {
    auto backend = CreateBackend("cpu", {2});
    ASSERT_OK(backend);
    backend_ = std::move(*backend);
    text_ = Corpus(6000);
    const TextSource source{"corpus.txt", text_};
    auto facts = EncodeTextCorpus({&source, 1}, 0.1, dir_.path());
    ASSERT_OK(facts) << facts.status();
    auto data = OpenTokenDataset(dir_.path());
    ASSERT_OK(data) << data.status();
    data_ = std::move(*data);
  }

  TrainConfig Config(int64_t max_iters, int64_t eval_interval) const {
    TrainConfig c;
    c.model = GptConfig({data_.vocab_size, 16, 2, 2, 32, /*tied=*/true});
    c.model.init = InitRule::kGpt2;
    c.optimizer.kind = OptimizerConfig::Kind::kAdamW;
    c.optimizer.lr = 3e-3f;
    c.optimizer.weight_decay = 0.1f;
    c.optimizer.decay_rule = OptimizerConfig::DecayRule::kMatrices;
    c.batch_size = 8;
    c.seed = 3;
    c.max_iters = max_iters;
    c.eval_interval = eval_interval;
    c.eval_iters = 4;
    c.epochs = static_cast<int>((max_iters + eval_interval - 1) / eval_interval);
    c.grad_clip = 1.0f;
    return c;
  }

  std::vector<std::vector<float>> Weights(Trainer& t) {
    std::vector<std::vector<float>> out;
    for (const NamedParameter& p : t.model().parameters()) {
      out.push_back(ToHost(*backend_, p.param->value));
    }
    return out;
  }

  std::unique_ptr<Backend> backend_;
  TempDir dir_;
  std::string text_;
  TokenDataset data_;
};

TEST_F(TokenTrainer, ALanguageModelsValidationLossFalls) {
  TrainConfig config = Config(120, 40);
  auto trainer = Trainer::Create(config, backend_.get(), &data_);
  ASSERT_OK(trainer) << trainer.status();
  auto before = (*trainer)->EvaluateTokens();
  ASSERT_OK(before);
  // An untrained model's loss is about ln(vocabulary).
  EXPECT_NEAR(before->loss, std::log(static_cast<double>(data_.vocab_size)), 0.3);
  std::vector<EpochEvent> epochs;
  std::vector<StepEvent> steps;
  Trainer::Callbacks cb;
  cb.on_epoch = [&](const EpochEvent& e) { epochs.push_back(e); };
  cb.on_step = [&](const StepEvent& e) { steps.push_back(e); };
  ASSERT_OK((*trainer)->Run(cb));
  ASSERT_EQ(epochs.size(), 3u);
  ASSERT_EQ(steps.size(), 120u);
  EXPECT_EQ(steps.back().global_step, 120);
  EXPECT_EQ(steps.front().steps_per_epoch, 40);
  EXPECT_EQ(epochs.back().test.samples, 4 * 8);  // eval_iters windows of batch_size
  EXPECT_LT(epochs.back().test.loss, before->loss - 1.0) << "validation loss did not fall";
  EXPECT_GT(epochs.back().test.accuracy, 0.3);
  EXPECT_LT(epochs.back().test.accuracy, 1.0);
  // Warm-up free constant rate here; the schedule is the optimizer's own tests'.
  EXPECT_FLOAT_EQ(steps.back().lr, 3e-3f);
}

// A run stopped at 50 of 100 iterations, checkpointed, and resumed in a new trainer ends with
// the weights of the run that never stopped.
TEST_F(TokenTrainer, AResumedRunIsTheUninterruptedOneBitForBit) {
  TrainConfig config = Config(100, 25);
  config.schedule.kind = LrScheduleConfig::Kind::kWarmupCosine;
  config.schedule.warmup_iters = 10;
  config.schedule.eta_min = 3e-4f;
  auto whole = Trainer::Create(config, backend_.get(), &data_);
  ASSERT_OK(whole) << whole.status();
  ASSERT_OK((*whole)->Run({}));

  auto first = Trainer::Create(config, backend_.get(), &data_);
  ASSERT_OK(first);
  std::atomic<bool> cancel{false};
  Trainer::Callbacks stop_midway;
  stop_midway.on_step = [&](const StepEvent& e) {
    if (e.global_step == 50) cancel = true;
  };
  EXPECT_TRUE(absl::IsCancelled((*first)->Run(stop_midway, &cancel)));
  EXPECT_EQ((*first)->position().global_step, 50);
  const std::string path = dir_.path() + "/mid.safetensors";
  ASSERT_OK((*first)->SaveCheckpoint(path));
  auto info = ReadCheckpointInfo(path);
  ASSERT_OK(info);
  EXPECT_EQ(info->vocabulary, data_.vocabulary->ToJson());  // serving reads it

  auto resumed = Trainer::Create(config, backend_.get(), &data_);
  ASSERT_OK(resumed);
  ASSERT_OK((*resumed)->LoadCheckpoint(path));
  ASSERT_OK((*resumed)->Run({}));
  EXPECT_EQ(Weights(**resumed), Weights(**whole));
}

// Two micro-batches per step: each step's loss is their mean, the tokens counted are both's.
TEST_F(TokenTrainer, GradientAccumulationTrainsOnEveryMicroBatch) {
  TrainConfig config = Config(20, 10);
  config.grad_accum = 2;
  auto trainer = Trainer::Create(config, backend_.get(), &data_);
  ASSERT_OK(trainer) << trainer.status();
  std::vector<EpochEvent> epochs;
  Trainer::Callbacks cb;
  cb.on_epoch = [&](const EpochEvent& e) { epochs.push_back(e); };
  ASSERT_OK((*trainer)->Run(cb));
  ASSERT_EQ(epochs.size(), 2u);
  EXPECT_TRUE(std::isfinite(epochs.back().train_loss));
  EXPECT_LT(epochs.back().test.loss, epochs.front().test.loss);
}

// SGD at lr 1 with clipping at c moves the weights by a vector of norm c when the gradient's
// norm is larger: the update is exactly the clipped gradient.
TEST_F(TokenTrainer, ClippingBoundsTheUpdatesNorm) {
  TrainConfig config = Config(1, 1);
  config.optimizer = OptimizerConfig{};
  config.optimizer.kind = OptimizerConfig::Kind::kSgd;
  config.optimizer.lr = 1.0f;
  config.grad_clip = 0.05f;
  auto trainer = Trainer::Create(config, backend_.get(), &data_);
  ASSERT_OK(trainer) << trainer.status();
  const auto before = Weights(**trainer);
  ASSERT_OK((*trainer)->Run({}));
  const auto after = Weights(**trainer);
  double sq = 0;
  for (size_t i = 0; i < before.size(); ++i) {
    for (size_t j = 0; j < before[i].size(); ++j) {
      const double d = double{after[i][j]} - before[i][j];
      sq += d * d;
    }
  }
  EXPECT_NEAR(std::sqrt(sq), 0.05, 0.05 * 1e-3);
}

TEST_F(TokenTrainer, DataThatDoesNotFitIsRefusedNamingIt) {
  TrainConfig config = Config(10, 10);
  config.model = GptConfig({data_.vocab_size - 1, 16, 1, 2, 32});
  auto small_vocab = Trainer::Create(config, backend_.get(), &data_);
  EXPECT_TRUE(absl::IsInvalidArgument(small_vocab.status()));
  EXPECT_THAT(std::string(small_vocab.status().message()),
              ::testing::HasSubstr("vocabulary of " + std::to_string(data_.vocab_size)));
  // A block longer than the validation split: no window fits.
  config = Config(10, 10);
  config.model = GptConfig({data_.vocab_size, 1024, 1, 2, 32});
  auto long_block = Trainer::Create(config, backend_.get(), &data_);
  EXPECT_FALSE(long_block.ok());
  EXPECT_THAT(std::string(long_block.status().message()),
              ::testing::HasSubstr("validation tokens"));
  // An image model on token data, and max_iters on an image dataset.
  config = Config(10, 10);
  config.model = MnistMlpConfig();
  EXPECT_FALSE(Trainer::Create(config, backend_.get(), &data_).ok());
  config.max_iters = 0;
  config.epochs = 1;
  EXPECT_THAT(std::string(Trainer::Create(config, backend_.get(), &data_).status().message()),
              ::testing::HasSubstr("set max_iters"));
}

// The child of ACorpusLargerThanTheProcessMayAllocateTrains: exits 0 when a tiny GPT trained on
// `dir` with 192 MiB of room to allocate, another code saying which step failed.
void TrainUnderDataLimit(const std::string& dir) {
  // What the process holds already (the libraries' data, the test binary's heap) plus 192 MiB.
  std::FILE* status = std::fopen("/proc/self/status", "r");
  if (status == nullptr) std::_Exit(2);
  char line[256];
  size_t data_kib = 0;
  while (std::fgets(line, sizeof(line), status) != nullptr) {
    if (std::sscanf(line, "VmData: %zu kB", &data_kib) == 1) break;
  }
  std::fclose(status);
  if (data_kib == 0) std::_Exit(2);
  rlimit limit;
  limit.rlim_cur = limit.rlim_max = data_kib * 1024 + (size_t{192} << 20);
  if (setrlimit(RLIMIT_DATA, &limit) != 0) std::_Exit(2);
  void* big = std::malloc(size_t{256} << 20);
  if (big != nullptr) std::_Exit(3);  // the limit would not have bitten
  auto backend = CreateBackend("cpu", {1});
  auto data = OpenTokenDataset(dir);
  if (!backend.ok() || !data.ok()) {
    std::fprintf(stderr, "%s / %s\n", backend.status().ToString().c_str(),
                 data.status().ToString().c_str());
    std::_Exit(4);
  }
  TrainConfig c;
  c.model = GptConfig({8, 16, 1, 2, 16});
  c.optimizer.kind = OptimizerConfig::Kind::kAdamW;
  c.batch_size = 4;
  c.max_iters = 3;
  c.eval_interval = 3;
  c.eval_iters = 1;
  c.epochs = 1;
  auto trainer = Trainer::Create(c, backend->get(), &*data);
  if (!trainer.ok()) {
    std::fprintf(stderr, "%s\n", trainer.status().ToString().c_str());
    std::_Exit(5);
  }
  if (absl::Status run = (*trainer)->Run({}); !run.ok()) {
    std::fprintf(stderr, "%s\n", run.ToString().c_str());
    std::_Exit(6);
  }
  std::_Exit(0);
}

// A corpus larger than the process may allocate trains: its shards stay mapped (page cache, not
// the job's memory). The child runs under a data limit (RLIMIT_DATA: heap and private mappings)
// 192 MiB above what it holds, which refuses a 256 MiB allocation, and trains on a 512 MiB shard.
TEST(TokenTrainerMemory, ACorpusLargerThanTheProcessMayAllocateTrains) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's allocator aborts instead of returning null under a data "
                  "limit (its shadow memory counts too); this test runs in the normal build";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  GTEST_SKIP() << "AddressSanitizer's allocator aborts instead of returning null under a data "
                  "limit (its shadow memory counts too); this test runs in the normal build";
#endif
#endif
  TempDir dir;
  const int64_t tokens = int64_t{256} << 20;  // 512 MiB of uint16 tokens, all id 0 (sparse)
  {
    const std::string path = dir.path() + "/train_000.bin";
    const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    const std::string header = TokenShardHeader(tokens);
    ASSERT_EQ(::write(fd, header.data(), header.size()), static_cast<ssize_t>(header.size()));
    ASSERT_EQ(::ftruncate(fd, kTokenShardHeaderBytes + 2 * tokens), 0);
    ::close(fd);
    std::vector<uint16_t> val(4096);
    for (size_t i = 0; i < val.size(); ++i) val[i] = static_cast<uint16_t>(i % 5);
    ASSERT_OK(WriteTokenShard(dir.path() + "/val_000.bin", val));
  }
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(TrainUnderDataLimit(dir.path()), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace kiln
