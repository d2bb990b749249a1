// Data-parallel training over 2-3 ranks as processes on 127.0.0.1 (Gloo, CPU backend), on small
// generated data with the reference MLP and CNN: ranks agree bit for bit after every step, a run
// repeats bit for bit, 2 ranks match one process at the same global batch within a tolerance,
// checkpoints of rank 0 resume and load single-process, and a dying rank fails the others.
#include "engine/distributed/data_parallel.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "engine/backend_registry.h"
#include "engine/data/token_data.h"
#include "engine/distributed/file_key_value_store.h"
#include "engine/distributed/gloo_communicator.h"
#include "engine/model/model.h"
#include "engine/reference_configs.h"
#include "engine/trainer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/distributed/rank_processes.h"
#include "tests/distributed/temp_folder.h"
#include "tests/engine/gpt_config.h"
#include "tests/engine/synthetic_data.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

using ::kiln::testing::MakeTempFolder;
using ::kiln::testing::RankExit;
using ::kiln::testing::RunRanks;
using ::testing::HasSubstr;

// One rank's run (or the single process's, with size 0: no communicator at all).
struct RankRun {
  TrainConfig config;
  int64_t train_size = 512, test_size = 200;
  int64_t last_rank_train_size = 0;  // when set, the last rank's training set (a mistake)
  absl::Duration timeout = absl::Seconds(30);
  // A rank that dies when its step `die_at_step` (global, 1-based) is done.
  int dying_rank = -1, die_at_step = 0;
  enum class Death { kExit, kSigkill, kSigstop } death = Death::kExit;
  std::string load_on_rank0;  // a checkpoint rank 0 (alone) loads before Run
  std::string save_from_rank0;
  // A language model's run: the token dataset folder every rank maps (train_size, test_size and
  // the bands datasets are then unused).
  std::string tokens_dir;
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void Spit(const std::string& path, const std::string& content) {
  std::ofstream(path, std::ios::binary) << content;
}

// Every parameter and buffer of the model, as raw bytes in model order.
std::string ModelBytes(Trainer& t) {
  std::string out;
  auto append = [&](const Tensor& v) {
    std::string b(v.bytes(), '\0');
    if (!t.backend()->CopyToHost(v, b.data(), b.size()).ok()) std::abort();
    out += b;
  };
  for (const NamedParameter& p : t.model().parameters()) append(p.param->value);
  for (const NamedBuffer& b : t.model().buffers()) {
    if (b.buffer->kind == BufferKind::kF32) append(b.buffer->value);
  }
  return out;
}

std::string ParameterBytes(Trainer& t) {
  std::string out;
  for (const NamedParameter& p : t.model().parameters()) {
    std::string b(p.param->value.bytes(), '\0');
    if (!t.backend()->CopyToHost(p.param->value, b.data(), b.size()).ok()) std::abort();
    out += b;
  }
  return out;
}

uint64_t Fnv1a(const std::string& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Runs in a child: trains `run` as `rank` of `size` and leaves in `dir`: rank<r>.status (OK or
// the error), .model (final parameters and buffers), .steps (per step: loss and a hash of the
// parameters), .epochs (per epoch: train loss, test loss and accuracy). Returns 0 when Run
// succeeded.
int TrainAsRank(const RankRun& run, int rank, int size, const std::string& dir) {
  const std::string out = absl::StrCat(dir, "/rank", rank);
  auto finish = [&](const absl::Status& s) {
    Spit(out + ".status", s.ok() ? "OK" : s.ToString());
    if (!s.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    return s.ok() ? 0 : 1;
  };
  auto backend = CreateBackend("cpu", {/*threads=*/1});
  if (!backend.ok()) return finish(backend.status());
  const int64_t train_size =
      rank == size - 1 && run.last_rank_train_size > 0 ? run.last_rank_train_size : run.train_size;
  const Dataset train = testing::BandsDataset(train_size, 10, 28, 11);
  const Dataset test = testing::BandsDataset(run.test_size, 10, 28, 12);
  TrainConfig config = run.config;
  std::unique_ptr<FileKeyValueStore> store;
  std::unique_ptr<Communicator> comm;
  if (size > 0) {
    auto opened = FileKeyValueStore::Open(dir + "/store");
    if (!opened.ok()) return finish(opened.status());
    store = std::move(*opened);
    GlooOptions options;
    options.timeout = run.timeout;
    auto joined = GlooCommunicator::Create(store.get(), rank, size, options);
    if (!joined.ok()) return finish(joined.status());
    comm = std::move(*joined);
    config.communicator = comm.get();
  }
  absl::StatusOr<TokenDataset> tokens = absl::NotFoundError("no token run");
  if (!run.tokens_dir.empty()) {
    tokens = OpenTokenDataset(run.tokens_dir);
    if (!tokens.ok()) return finish(tokens.status());
  }
  auto trainer = tokens.ok() ? Trainer::Create(config, backend->get(), &*tokens)
                             : Trainer::Create(config, backend->get(), &train, &test);
  if (!trainer.ok()) return finish(trainer.status());
  Trainer& t = **trainer;
  if (!run.load_on_rank0.empty() && rank == 0) {
    if (absl::Status s = t.LoadCheckpoint(run.load_on_rank0); !s.ok()) return finish(s);
  }
  std::string steps, epochs;
  Trainer::Callbacks cb;
  cb.on_step = [&](const StepEvent& e) {
    absl::StrAppend(&steps, e.global_step, " ", absl::StrFormat("%.9g", e.loss), " ",
                    Fnv1a(ParameterBytes(t)), "\n");
    if (rank == run.dying_rank && e.global_step == run.die_at_step) {
      if (run.death == RankRun::Death::kSigkill) raise(SIGKILL);
      if (run.death == RankRun::Death::kSigstop) raise(SIGSTOP);  // hangs, sockets open
      _exit(3);
    }
  };
  cb.on_epoch = [&](const EpochEvent& e) {
    absl::StrAppend(&epochs, e.epoch, " ", absl::StrFormat("%.9g", e.train_loss), " ",
                    absl::StrFormat("%.9g", e.train_accuracy), " ",
                    absl::StrFormat("%.9g", e.test.loss), " ",
                    absl::StrFormat("%.9g", e.test.accuracy), "\n");
  };
  absl::Status s = t.Run(cb);
  Spit(out + ".steps", steps);
  Spit(out + ".epochs", epochs);
  Spit(out + ".model", ModelBytes(t));
  if (s.ok() && !run.save_from_rank0.empty()) {
    absl::Status saved = t.SaveCheckpoint(run.save_from_rank0);
    if (rank == 0) s = saved;
    if (rank != 0 && saved.code() != absl::StatusCode::kFailedPrecondition) {
      s = absl::InternalError(absl::StrCat("rank ", rank, " SaveCheckpoint: ", saved.ToString()));
    }
  }
  return finish(s);
}

// Trains `run` over `size` ranks (0: one process without a communicator) in a fresh folder,
// expecting success; returns the folder.
std::string TrainRanks(const RankRun& run, int size) {
  std::string dir = MakeTempFolder();
  const int processes = std::max(size, 1);
  auto exits = RunRanks(
      processes, [&](int rank) { return TrainAsRank(run, rank, size, dir); }, 120);
  for (int r = 0; r < processes; ++r) {
    EXPECT_EQ(exits[r].exit_code, 0)
        << "rank " << r << ": " << Slurp(absl::StrCat(dir, "/rank", r, ".status"));
  }
  return dir;
}

std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

// The largest |a - b| over the models' values, and the largest |a|.
std::pair<double, double> MaxDifference(const std::string& a, const std::string& b) {
  const std::vector<float> x = Floats(a), y = Floats(b);
  EXPECT_EQ(x.size(), y.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(x[i]) - y[i]));
    scale = std::max(scale, std::abs(static_cast<double>(x[i])));
  }
  return {diff, scale};
}

RankRun MlpRun() {
  RankRun run;
  run.config = MnistMlpReference();
  run.config.batch_size = 64;
  run.config.epochs = 2;
  run.config.optimizer.lr = 0.01f;  // learns something in 16 steps
  run.config.seed = 5;
  return run;
}

RankRun CnnRun() {
  RankRun run;
  run.config = MnistCnnReference();
  run.config.batch_size = 64;  // over 3 ranks: slices of 22, 21 and 21
  run.config.epochs = 1;
  run.config.seed = 6;
  run.train_size = 256;
  run.test_size = 100;
  return run;
}

// The per-step losses and parameter hashes, and the final model, equal on every rank.
void ExpectRanksIdentical(const std::string& dir, int size) {
  const std::string steps0 = Slurp(dir + "/rank0.steps");
  const std::string model0 = Slurp(dir + "/rank0.model");
  const std::string epochs0 = Slurp(dir + "/rank0.epochs");
  EXPECT_FALSE(steps0.empty());
  EXPECT_FALSE(model0.empty());
  for (int r = 1; r < size; ++r) {
    const std::string rank = absl::StrCat(dir, "/rank", r);
    EXPECT_EQ(Slurp(rank + ".steps"), steps0) << "rank " << r << "'s steps differ from rank 0's";
    EXPECT_TRUE(Slurp(rank + ".model") == model0) << "rank " << r << "'s model differs";
    EXPECT_EQ(Slurp(rank + ".epochs"), epochs0) << "rank " << r << "'s epoch events differ";
  }
}

TEST(SliceOf, SplitsEvenlyWithTheRemainderOnTheFirstRanks) {
  EXPECT_EQ(SliceOf(10, 0, 3).offset, 0);
  EXPECT_EQ(SliceOf(10, 0, 3).count, 4);
  EXPECT_EQ(SliceOf(10, 1, 3).offset, 4);
  EXPECT_EQ(SliceOf(10, 1, 3).count, 3);
  EXPECT_EQ(SliceOf(10, 2, 3).offset, 7);
  EXPECT_EQ(SliceOf(10, 2, 3).count, 3);
  EXPECT_EQ(SliceOf(64, 1, 2).offset, 32);
  EXPECT_EQ(SliceOf(64, 1, 2).count, 32);
  EXPECT_EQ(SliceOf(7, 0, 1).count, 7);
}

TEST(CheckDataParallelBatches, RefusesARankWithoutSamples) {
  const ModelConfig mlp = MnistMlpReference().model;
  EXPECT_OK(CheckDataParallelBatches(mlp, 64, 512, 3));
  // 513 samples leave a last batch of 1 that 2 ranks cannot share.
  absl::Status s = CheckDataParallelBatches(mlp, 64, 513, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("a batch of 1"));
  EXPECT_EQ(CheckDataParallelBatches(mlp, 2, 512, 3).code(), absl::StatusCode::kInvalidArgument);
  // Slices of 1 sample are fine without batch normalisation, not with batchnorm1d.
  EXPECT_OK(CheckDataParallelBatches(mlp, 3, 513, 3));
  ModelConfig bn = mlp;
  bn.layers.insert(bn.layers.begin() + 1, BatchNorm1dConfig{512});
  EXPECT_THAT(CheckDataParallelBatches(bn, 3, 513, 3).message(), HasSubstr("slice of 1 sample"));
}

TEST(DataParallelTraining, TwoRanksMlpAgreeEveryStepRepeatAndMatchOneProcess) {
  const RankRun run = MlpRun();
  const std::string two = TrainRanks(run, 2);
  ExpectRanksIdentical(two, 2);
  // The same world size again: bit for bit.
  const std::string again = TrainRanks(run, 2);
  EXPECT_EQ(Slurp(again + "/rank0.steps"), Slurp(two + "/rank0.steps"));
  EXPECT_TRUE(Slurp(again + "/rank0.model") == Slurp(two + "/rank0.model"));
  // One process, the same global batch of 64. The losses and logits' gradients are the same
  // bits (a slice's mean times 1/2 is the batch's mean exactly); only the order of summing 64
  // samples' gradients differs (32 + 32 then the allreduce's sum, against one GEMM over 64),
  // about 1 ulp a step, which 16 SGD steps with momentum carry on (measured: 7.5e-9 with
  // weights up to 0.077). 1e-5 of the largest weight is far above that and far below any real
  // difference (another sample, mask or batch moves weights by ~1e-3).
  const std::string one = TrainRanks(run, 0);
  const auto [diff, scale] =
      MaxDifference(Slurp(two + "/rank0.model"), Slurp(one + "/rank0.model"));
  std::printf("2 ranks vs 1 process: max |dw| %.3g, max |w| %.3g\n", diff, scale);
  EXPECT_LE(diff, 1e-5 * scale);
  std::printf("epochs, 2 ranks:\n%s1 process:\n%s", Slurp(two + "/rank0.epochs").c_str(),
              Slurp(one + "/rank0.epochs").c_str());
}

TEST(DataParallelTraining, ThreeRanksCnnUnevenSlicesAgreeAndMatchOneProcess) {
  const RankRun run = CnnRun();
  const std::string three = TrainRanks(run, 3);
  ExpectRanksIdentical(three, 3);
  // 64 over 3 ranks is 22 + 21 + 21: the loss gradients are scaled by 22/64 and 21/64 (not
  // exact) and summed in another order, ~1e-7 relative. Adam's step m / sqrt(v) ignores the
  // gradient's scale but not its direction: where a weight's gradient is a near-cancellation
  // the two runs can step it differently, by up to lr (1e-3) a step. Measured: 2.6e-6 after 4
  // steps; the bound is 5% of one step.
  const std::string one = TrainRanks(run, 0);
  const auto [diff, scale] =
      MaxDifference(Slurp(three + "/rank0.model"), Slurp(one + "/rank0.model"));
  std::printf("3 ranks vs 1 process: max |dw| %.3g, max |w| %.3g\n", diff, scale);
  EXPECT_LE(diff, 0.05 * run.config.optimizer.lr);
}

// A language model's ranks take disjoint slices of every batch of windows (one draw, the same on
// every rank), so two ranks are one process at the same global batch but for summation order.
TEST(DataParallelTraining, TwoRanksGptOnTokenWindowsAgreeAndMatchOneProcess) {
  const std::string tokens = MakeTempFolder();
  std::string text;
  for (int i = 0; text.size() < 4000; ++i) text += i % 3 ? "the cat sat. " : "a dog ran! ";
  const TextSource source{"corpus.txt", text};
  ASSERT_OK(EncodeTextCorpus({&source, 1}, 0.1, tokens).status());
  RankRun run;
  run.tokens_dir = tokens;
  run.config.model = testing::GptConfig({16, 8, 1, 2, 16, /*tied=*/true});
  run.config.optimizer.kind = OptimizerConfig::Kind::kAdamW;
  run.config.batch_size = 6;  // 3 windows a rank
  run.config.max_iters = 6;
  run.config.eval_interval = 3;
  run.config.eval_iters = 2;
  run.config.epochs = 2;
  run.config.grad_clip = 1.0f;
  run.config.seed = 9;
  const std::string two = TrainRanks(run, 2);
  ExpectRanksIdentical(two, 2);
  const std::string one = TrainRanks(run, 0);
  const auto [diff, scale] =
      MaxDifference(Slurp(two + "/rank0.model"), Slurp(one + "/rank0.model"));
  std::printf("2 ranks vs 1 process (GPT): max |dw| %.3g, max |w| %.3g\n", diff, scale);
  // Adam's near-cancelling gradients step apart by up to lr (1e-3) a step, as for the CNN.
  // Measured 5.1e-5 after 6 steps; the lm_head's gradient lost from the allreduce (the tied table
  // read through a stale copy) moved weights by 1.1e-2.
  EXPECT_LE(diff, 0.2 * run.config.optimizer.lr);
}

TEST(DataParallelTraining, DropoutDrawsWhatOneProcessDraws) {
  RankRun run = MlpRun();
  run.config.epochs = 1;
  run.config.model.layers.insert(run.config.model.layers.begin() + 2, DropoutConfig{0.3f});
  const std::string two = TrainRanks(run, 2);
  ExpectRanksIdentical(two, 2);
  const std::string one = TrainRanks(run, 0);
  const auto [diff, scale] =
      MaxDifference(Slurp(two + "/rank0.model"), Slurp(one + "/rank0.model"));
  std::printf("dropout, 2 ranks vs 1 process: max |dw| %.3g, max |w| %.3g\n", diff, scale);
  EXPECT_LE(diff, 1e-5 * scale);  // other masks would move weights by ~1e-3
}

TEST(DataParallelTraining, BatchNormStatisticsAreRankZerosOnEveryRank) {
  RankRun run = MlpRun();
  run.config.epochs = 1;
  run.config.model.layers.insert(run.config.model.layers.begin() + 1, BatchNorm1dConfig{512});
  const std::string two = TrainRanks(run, 2);
  ExpectRanksIdentical(two, 2);  // .model holds the running statistics too
}

TEST(DataParallelTraining, RankZerosCheckpointResumesAndLoadsInOneProcess) {
  // Two epochs straight, against one epoch, a checkpoint by rank 0, and a second epoch that
  // only rank 0 resumes from the file (Run broadcasts its state to rank 1).
  const RankRun straight = MlpRun();
  const std::string whole = TrainRanks(straight, 2);
  const std::string ckpt_dir = MakeTempFolder();
  RankRun first = MlpRun();
  first.config.epochs = 1;
  first.save_from_rank0 = ckpt_dir + "/epoch1.safetensors";
  TrainRanks(first, 2);
  RankRun second = MlpRun();
  second.load_on_rank0 = first.save_from_rank0;
  second.save_from_rank0 = ckpt_dir + "/epoch2.safetensors";
  const std::string resumed = TrainRanks(second, 2);
  ExpectRanksIdentical(resumed, 2);
  EXPECT_TRUE(Slurp(resumed + "/rank1.model") == Slurp(whole + "/rank1.model"));
  // Steps 9-16 of the straight run are the resumed run's steps, losses and weights.
  const std::string straight_steps = Slurp(whole + "/rank1.steps");
  const size_t step9 = straight_steps.find("\n9 ");
  ASSERT_NE(step9, std::string::npos);
  EXPECT_EQ(Slurp(resumed + "/rank1.steps"), straight_steps.substr(step9 + 1));

  // The checkpoint in one process: the same weights, and the test accuracy the ranks reported.
  const std::string check = MakeTempFolder();
  auto exits = RunRanks(1, [&](int) {
    auto backend = CreateBackend("cpu", {/*threads=*/1});
    const Dataset train = testing::BandsDataset(512, 10, 28, 11);
    const Dataset test = testing::BandsDataset(200, 10, 28, 12);
    auto trainer = Trainer::Create(straight.config, backend->get(), &train, &test);
    if (!trainer.ok() || !(*trainer)->LoadCheckpoint(second.save_from_rank0).ok()) return 1;
    auto eval = (*trainer)->Evaluate(test);
    if (!eval.ok()) return 1;
    Spit(check + "/model", ModelBytes(**trainer));
    Spit(check + "/accuracy", absl::StrFormat("%.9g", eval->accuracy));
    return 0;
  });
  ASSERT_EQ(exits[0].exit_code, 0);
  EXPECT_TRUE(Slurp(check + "/model") == Slurp(whole + "/rank0.model"));
  const std::string last_epoch = Slurp(whole + "/rank0.epochs");
  EXPECT_THAT(last_epoch, HasSubstr(absl::StrCat(" ", Slurp(check + "/accuracy"), "\n")));
}

TEST(DataParallelTraining, RanksWithDifferentDataFailTogetherBeforeTraining) {
  RankRun run = MlpRun();
  run.last_rank_train_size = 576;
  const std::string dir = MakeTempFolder();
  auto exits = RunRanks(
      2, [&](int rank) { return TrainAsRank(run, rank, 2, dir); }, 60);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(exits[r].exit_code, 1) << "rank " << r;
    EXPECT_THAT(Slurp(absl::StrCat(dir, "/rank", r, ".status")),
                HasSubstr("data-parallel ranks disagree: 1 of 2 ranks differ from rank 0"));
    EXPECT_EQ(Slurp(absl::StrCat(dir, "/rank", r, ".steps")), "") << "rank " << r << " trained";
  }
}

void ExpectOthersFailFast(const RankRun& run, int size, const std::vector<RankExit>& exits,
                          const std::string& dir) {
  const double limit = absl::ToDoubleSeconds(run.timeout) + 10;
  for (int r = 0; r < size; ++r) {
    if (r == run.dying_rank) continue;
    const std::string status = Slurp(absl::StrCat(dir, "/rank", r, ".status"));
    EXPECT_FALSE(exits[r].timed_out) << "rank " << r << " hung";
    EXPECT_EQ(exits[r].exit_code, 1) << "rank " << r;
    EXPECT_LT(exits[r].seconds, limit) << "rank " << r;
    EXPECT_THAT(status, HasSubstr("gloo")) << "rank " << r;
    EXPECT_THAT(status, HasSubstr(absl::StrCat("on rank ", r, " of ", size))) << "rank " << r;
    std::printf("rank %d after %.1f s: %s\n", r, exits[r].seconds, status.c_str());
  }
}

TEST(DataParallelTraining, RankThatExitsMidTrainingFailsTheOthersWithinTheTimeout) {
  RankRun run = MlpRun();
  run.timeout = absl::Seconds(3);
  run.dying_rank = 2;
  run.die_at_step = 3;
  const std::string dir = MakeTempFolder();
  auto exits = RunRanks(
      3, [&](int rank) { return TrainAsRank(run, rank, 3, dir); }, 60);
  EXPECT_EQ(exits[2].exit_code, 3);
  ExpectOthersFailFast(run, 3, exits, dir);
}

TEST(DataParallelTraining, RankThatHangsFailsTheOthersWhenTheTimeoutPasses) {
  // SIGSTOP: the rank's sockets stay open, so only the timeout can tell the others.
  RankRun run = MlpRun();
  run.timeout = absl::Seconds(3);
  run.dying_rank = 1;
  run.die_at_step = 2;
  run.death = RankRun::Death::kSigstop;
  const std::string dir = MakeTempFolder();
  auto exits = RunRanks(
      3, [&](int rank) { return TrainAsRank(run, rank, 3, dir); }, 8);
  EXPECT_TRUE(exits[1].timed_out);  // RunRanks killed it at its deadline
  ExpectOthersFailFast(run, 3, exits, dir);
  for (int r : {0, 2}) EXPECT_GE(exits[r].seconds, 2.5) << "rank " << r << " did not wait";
}

TEST(DataParallelTraining, RankKilledMidTrainingFailsTheOtherWithinTheTimeout) {
  RankRun run = CnnRun();
  run.timeout = absl::Seconds(3);
  run.dying_rank = 1;
  run.die_at_step = 2;
  run.death = RankRun::Death::kSigkill;
  const std::string dir = MakeTempFolder();
  auto exits = RunRanks(
      2, [&](int rank) { return TrainAsRank(run, rank, 2, dir); }, 60);
  EXPECT_EQ(exits[1].signal, SIGKILL);
  ExpectOthersFailFast(run, 2, exits, dir);
}

}  // namespace
}  // namespace kiln
