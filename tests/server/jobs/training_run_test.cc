// The training run's rules, driven through a host that records what it was asked: step samples
// and improvement, the checkpoints decided after epochs, on demand, on stop and cancel and at the
// end, and how a host's errors and commands stop the run. A real Trainer on a tiny table.
#include "server/jobs/training_run.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend_registry.h"
#include "engine/data/dataset.h"
#include "engine/trainer.h"

namespace kiln::server {
namespace {

// 20 samples of 4 features in 2 classes; batches of 8 make steps of 8, 8 and 4 samples.
Dataset TinyTable() {
  Dataset d;
  d.sample_shape = {4};
  d.size = 20;
  d.num_classes = 2;
  for (int i = 0; i < 20; ++i) {
    for (int f = 0; f < 4; ++f) d.features.push_back(static_cast<float>((i * 7 + f) % 5) - 2.f);
    d.labels.push_back(i % 2);
  }
  return d;
}

TrainConfig TinyConfig(int epochs) {
  TrainConfig c;
  c.model.input_shape = {4};
  c.model.layers = {LinearConfig{4, 2}};
  c.optimizer.lr = 0.1f;
  c.epochs = epochs;
  c.batch_size = 8;
  return c;
}

// Records everything; answers commands from a script (per call) and fails where told.
struct RecordingHost : TrainingRunHost {
  std::vector<int64_t> step_samples;
  std::vector<std::pair<int, bool>> epochs;  // (epoch, improved)
  std::vector<v1::CheckpointKind> written;
  std::vector<v1::CheckpointKind> failed;
  std::vector<int64_t> written_steps;
  std::vector<RunCommands> script;  // the n-th Commands call's answer; then none
  int commands_calls = 0;
  int stopping_calls = 0;
  absl::Status step_error;
  v1::CheckpointKind failing_kind = v1::CHECKPOINT_KIND_UNSPECIFIED;

  absl::Status OnStep(const StepEvent&, int64_t samples, double seconds) override {
    EXPECT_GE(seconds, 0);
    step_samples.push_back(samples);
    return step_error;
  }
  absl::Status OnEpoch(const EpochEvent& e, bool improved, double) override {
    epochs.emplace_back(e.epoch, improved);
    return absl::OkStatus();
  }
  absl::StatusOr<RunCommands> Commands(Trainer&) override {
    const int n = commands_calls++;
    return n < static_cast<int>(script.size()) ? script[n] : RunCommands{};
  }
  absl::Status WriteCheckpoint(Trainer& t, v1::CheckpointKind kind) override {
    if (kind == failing_kind) return absl::ResourceExhaustedError("disk full");
    written.push_back(kind);
    written_steps.push_back(t.position().global_step);
    return absl::OkStatus();
  }
  void CheckpointFailed(v1::CheckpointKind kind, const absl::Status&) override {
    failed.push_back(kind);
  }
  bool HasCheckpointAt(int64_t step) override {
    for (int64_t s : written_steps) {
      if (s == step) return true;
    }
    return false;
  }
  absl::Status BeforeStopping() override {
    ++stopping_calls;
    return absl::OkStatus();
  }
};

class TrainingRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto backend = CreateBackend("cpu", BackendOptions{});
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = *std::move(backend);
  }

  absl::Status Run(RecordingHost& host, const v1::CheckpointPolicy& proto, int epochs,
                   double best_so_far = 0) {
    config_ = TinyConfig(epochs);
    auto trainer = Trainer::Create(config_, backend_.get(), &data_, nullptr);
    if (!trainer.ok()) return trainer.status();
    trainer_ = *std::move(trainer);
    const CheckpointPolicy policy(proto);
    TrainingRun run(policy, config_.batch_size, data_.size, best_so_far, &host);
    return run.Run(*trainer_);
  }

  Dataset data_ = TinyTable();
  TrainConfig config_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Trainer> trainer_;
};

TEST(StepSamplesTest, AFullBatchOrWhatIsLeftForTheLast) {
  EXPECT_EQ(StepSamples(8, 20, 1), 8);
  EXPECT_EQ(StepSamples(8, 20, 2), 8);
  EXPECT_EQ(StepSamples(8, 20, 3), 4);
  EXPECT_EQ(StepSamples(64, 64, 1), 64);
}

TEST(BestEpochTest, TestAccuracyWhenThereIsATestSplitElseTrainingAndTheFirstAlwaysImproves) {
  BestEpoch best(0.9);
  EpochEvent e;
  e.epoch = 1;
  e.test.samples = 10;
  e.test.accuracy = 0.5;
  EXPECT_TRUE(best.Observe(e)) << "the first epoch always improves";
  EXPECT_DOUBLE_EQ(best.best(), 0.5);
  e.epoch = 2;
  e.test.accuracy = 0.5;
  EXPECT_FALSE(best.Observe(e)) << "equal is not better";
  e.test.accuracy = 0.6;
  e.train_accuracy = 0.1;
  EXPECT_TRUE(best.Observe(e));
  EXPECT_DOUBLE_EQ(best.best(), 0.6);
  e.test.samples = 0;  // no test split: the training accuracy counts
  e.train_accuracy = 0.7;
  EXPECT_TRUE(best.Observe(e));
  EXPECT_DOUBLE_EQ(best.best(), 0.7);
}

TEST_F(TrainingRunTest, EpochCheckpointsFollowThePolicyAndTheEndLeavesOneFinal) {
  RecordingHost host;
  v1::CheckpointPolicy policy;
  policy.set_every_n_epochs(2);
  ASSERT_TRUE(Run(host, policy, 3).ok());
  EXPECT_EQ(host.step_samples, (std::vector<int64_t>{8, 8, 4, 8, 8, 4, 8, 8, 4}));
  ASSERT_EQ(host.epochs.size(), 3u);
  EXPECT_TRUE(host.epochs[0].second);
  EXPECT_EQ(host.written, (std::vector<v1::CheckpointKind>{v1::CHECKPOINT_KIND_PERIODIC,
                                                           v1::CHECKPOINT_KIND_FINAL}));
  EXPECT_EQ(host.written_steps, (std::vector<int64_t>{6, 9}));
}

TEST_F(TrainingRunTest, NoFinalCheckpointWhereOneExistsAtTheLastStep) {
  RecordingHost host;
  v1::CheckpointPolicy policy;
  policy.set_every_n_epochs(1);
  ASSERT_TRUE(Run(host, policy, 2).ok());
  EXPECT_EQ(host.written, (std::vector<v1::CheckpointKind>{v1::CHECKPOINT_KIND_PERIODIC,
                                                           v1::CHECKPOINT_KIND_PERIODIC}));
}

TEST_F(TrainingRunTest, KeepBestWritesWhenTheEpochImprovesOnTheJobsBest) {
  RecordingHost host;
  v1::CheckpointPolicy policy;
  policy.set_keep_best(true);
  // A best of 2 (above any accuracy) from an earlier attempt: only the first epoch "improves".
  ASSERT_TRUE(Run(host, policy, 2, /*best_so_far=*/2.0).ok());
  ASSERT_EQ(host.epochs.size(), 2u);
  EXPECT_TRUE(host.epochs[0].second);
  EXPECT_FALSE(host.epochs[1].second);
  EXPECT_EQ(host.written,
            (std::vector<v1::CheckpointKind>{v1::CHECKPOINT_KIND_BEST, v1::CHECKPOINT_KIND_FINAL}));
}

TEST_F(TrainingRunTest, OnDemandCheckpointIsWrittenAndAFailedOneIsToldWhileTrainingGoesOn) {
  RecordingHost host;
  host.script = {RunCommands{.checkpoint = true}};
  ASSERT_TRUE(Run(host, v1::CheckpointPolicy(), 1).ok());
  EXPECT_EQ(host.written, (std::vector<v1::CheckpointKind>{v1::CHECKPOINT_KIND_ON_DEMAND,
                                                           v1::CHECKPOINT_KIND_FINAL}));
  RecordingHost failing;
  failing.script = {RunCommands{.checkpoint = true}};
  failing.failing_kind = v1::CHECKPOINT_KIND_ON_DEMAND;
  ASSERT_TRUE(Run(failing, v1::CheckpointPolicy(), 1).ok());
  EXPECT_EQ(failing.failed, (std::vector<v1::CheckpointKind>{v1::CHECKPOINT_KIND_ON_DEMAND}));
  EXPECT_EQ(failing.step_samples.size(), 3u) << "the run went on to its end";
}

TEST_F(TrainingRunTest, StopKeepsWhereTheRunGotToAndEndsAborted) {
  RecordingHost host;
  host.script = {RunCommands{}, RunCommands{.stop = true}};
  absl::Status s = Run(host, v1::CheckpointPolicy(), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_EQ(host.written, (std::vector<v1::CheckpointKind>{v1::CHECKPOINT_KIND_SHUTDOWN}));
  EXPECT_EQ(host.written_steps, (std::vector<int64_t>{2}));
  EXPECT_EQ(host.stopping_calls, 1);
}

TEST_F(TrainingRunTest, CancelWritesACancelCheckpointUnlessThePolicySaysNo) {
  RecordingHost host;
  host.script = {RunCommands{.cancel = true}};
  absl::Status s = Run(host, v1::CheckpointPolicy(), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_EQ(s.message(), "cancelled at global step 1");
  EXPECT_EQ(host.written, (std::vector<v1::CheckpointKind>{v1::CHECKPOINT_KIND_CANCEL}));

  RecordingHost off;
  off.script = {RunCommands{.cancel = true}};
  v1::CheckpointPolicy no_shutdown;
  no_shutdown.set_on_shutdown(false);
  EXPECT_EQ(Run(off, no_shutdown, 2).code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(off.written.empty());
  EXPECT_EQ(off.stopping_calls, 1);
}

TEST_F(TrainingRunTest, AHostErrorStopsTheRunAtTheStepsEndWritingNothing) {
  RecordingHost host;
  host.step_error = absl::UnavailableError("store gone");
  absl::Status s = Run(host, v1::CheckpointPolicy(), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(host.step_samples.size(), 1u);
  EXPECT_TRUE(host.written.empty());
}

TEST_F(TrainingRunTest, AFailedEpochCheckpointFailsTheRunNamingTheEpoch) {
  RecordingHost host;
  host.failing_kind = v1::CHECKPOINT_KIND_PERIODIC;
  v1::CheckpointPolicy policy;
  policy.set_every_n_epochs(1);
  absl::Status s = Run(host, policy, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(s.message(), "checkpoint after epoch 1: disk full");
}

TEST_F(TrainingRunTest, AFailedFinalCheckpointFailsTheRun) {
  RecordingHost host;
  host.failing_kind = v1::CHECKPOINT_KIND_FINAL;
  absl::Status s = Run(host, v1::CheckpointPolicy(), 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(s.message(), "final checkpoint: disk full");
}

}  // namespace
}  // namespace kiln::server
