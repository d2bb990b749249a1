// The job manager driven directly, without gRPC or a daemon: a JobStore in a temporary state dir,
// a catalog holding one tiny IDX dataset, and a recording JobEventObserver that checks the one
// observer interface is told of what the core does.
#include "server/jobs/job_manager.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/sha256.h"
#include "engine/model/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/datasets/dataset_catalog.h"
#include "server/jobs/job_event_observer.h"
#include "server/jobs/job_store.h"
#include "server/jobs/job_vocabulary.h"
#include "server/jobs/metric_broadcaster.h"
#include "tests/server/jobs/job_manager_fixture.h"
#include "server_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::server {
namespace {
namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::SmallSpec;
using ::testing::StartsWith;
using testing::WaitFor;

using testing::JobManagerTest;
using testing::kEndless;
using testing::kStepsPerEpoch;
using testing::kTrainSamples;
using testing::kWait;
using testing::RecordingObserver;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

TEST_F(JobManagerTest, SubmittedJobRunsToSucceededAndTheObserverSeesEveryStateInOrder) {
  StartManager(Options());
  absl::StatusOr<v1::Job> submitted = manager_->Submit(SmallSpec("toy", 2));
  ASSERT_OK(submitted);
  EXPECT_EQ(submitted->state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(submitted->device(), "cpu");
  const std::string id = submitted->id();

  v1::Job job;
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED, &job));
  EXPECT_EQ(job.epochs(), 2);
  EXPECT_EQ(job.epochs_done(), 2);
  EXPECT_EQ(job.global_step(), 2 * kStepsPerEpoch);
  EXPECT_EQ(job.parameter_count(), 784 * 32 + 32 + 32 * 10 + 10);
  EXPECT_EQ(job.attempts(), 1);
  EXPECT_EQ(job.resumed_from_step(), 0);
  EXPECT_TRUE(job.has_end_time());

  // No periodic policy: the one checkpoint is the final model's, announced before the end.
  EXPECT_THAT(
      observer_.Lines(id),
      ElementsAre("state JOB_STATE_UNSPECIFIED->JOB_STATE_QUEUED", "submitted",
                  "state JOB_STATE_QUEUED->JOB_STATE_RUNNING",
                  absl::StrCat("checkpoint CHECKPOINT_KIND_FINAL step ", 2 * kStepsPerEpoch),
                  "state JOB_STATE_RUNNING->JOB_STATE_SUCCEEDED"));
  const std::vector<v1::Checkpoint> checkpoints = CheckpointsOf(id);
  ASSERT_EQ(checkpoints.size(), 1u);
  EXPECT_EQ(checkpoints[0].kind(), v1::CHECKPOINT_KIND_FINAL);
  EXPECT_TRUE(fs::exists(checkpoints[0].path())) << checkpoints[0].path();
  // The store holds what Get() says.
  absl::StatusOr<v1::Job> stored = store_->GetJob(id);
  ASSERT_OK(stored);
  EXPECT_EQ(stored->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(stored->global_step(), 2 * kStepsPerEpoch);
}

// A watcher that joins a running job replays what was recorded, read in pages of 4 (never more
// held), then takes live events from the next seq on: every seq once, in order, to the end.
TEST_F(JobManagerTest, WatchReplaysTheHistoryInPagesThenLiveEventsWithoutAGapOrARepeat) {
  JobManagerOptions options = Options();
  options.replay_page_events = 4;
  options.step_delay = absl::Milliseconds(5);
  StartManager(std::move(options));
  const std::string id = SubmitOrDie(SmallSpec("toy", 6));
  ASSERT_TRUE(WaitForSteps(id, 20));
  absl::StatusOr<JobWatch> watch = manager_->Watch(id, /*include_steps=*/true, false);
  ASSERT_OK(watch);
  ASSERT_NE(watch->history, nullptr);
  ASSERT_NE(watch->live, nullptr) << "the job was still running";
  EXPECT_FALSE(watch->current_state.has_value());

  std::vector<v1::JobEvent> events;
  v1::JobEvent e;
  for (;;) {
    absl::StatusOr<bool> next = watch->history->Next(&e);
    ASSERT_OK(next);
    if (!*next) break;
    EXPECT_LT(watch->history->buffered(), 4u) << "more than one page held";
    EXPECT_TRUE(e.replayed());
    events.push_back(e);
    absl::SleepFor(absl::Milliseconds(2));  // slower than training: live events pile up
  }
  const size_t replayed = events.size();
  EXPECT_GE(replayed, 22u) << "2 states and 20 steps were recorded before the watch";
  absl::Status closed;
  while (!watch->live->Finished(&closed)) {
    if (!watch->live->WaitPop(&e, absl::Seconds(1))) continue;
    EXPECT_FALSE(e.replayed());
    EXPECT_EQ(e.dropped_before(), 0);
    events.push_back(e);
  }
  broadcaster_.Unsubscribe(watch->live);
  EXPECT_OK(closed);
  EXPECT_GT(events.size(), replayed) << "no live events after the replay";
  for (size_t i = 0; i < events.size(); ++i) {
    ASSERT_EQ(events[i].seq(), static_cast<int64_t>(i + 1)) << "a gap or a repeat at event " << i;
  }
  int steps = 0;
  for (const v1::JobEvent& event : events) steps += event.has_step();
  EXPECT_EQ(steps, 6 * kStepsPerEpoch);
  EXPECT_EQ(events.back().state().state(), v1::JOB_STATE_SUCCEEDED);

  // Watching the finished job: its whole history, paged the same way, and nothing live.
  watch = manager_->Watch(id, /*include_steps=*/true, false);
  ASSERT_OK(watch);
  EXPECT_EQ(watch->live, nullptr);
  size_t again = 0;
  for (;;) {
    absl::StatusOr<bool> next = watch->history->Next(&e);
    ASSERT_OK(next);
    if (!*next) break;
    EXPECT_EQ(e.seq(), events[again].seq());
    EXPECT_EQ(e.event_case(), events[again].event_case());
    ++again;
  }
  EXPECT_EQ(again, events.size());
}

TEST_F(JobManagerTest, CancelOfAQueuedJobEndsItCancelledWithoutRunningIt) {
  JobManagerOptions options = Options();
  options.step_delay = absl::Milliseconds(20);
  StartManager(options);
  const std::string running = SubmitOrDie(SmallSpec("toy", kEndless));
  const std::string queued = SubmitOrDie(SmallSpec("toy", 1));
  ASSERT_FALSE(running.empty());
  ASSERT_FALSE(queued.empty());

  absl::StatusOr<v1::Job> cancelled = manager_->Cancel(queued);
  ASSERT_OK(cancelled);
  // A queued job is cancelled at once.
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(cancelled->reason(), "cancelled by request");
  v1::Job job;
  ASSERT_TRUE(WaitForState(queued, v1::JOB_STATE_CANCELLED, &job));
  EXPECT_EQ(job.attempts(), 0);
  EXPECT_THAT(observer_.States(queued), ElementsAre("state JOB_STATE_UNSPECIFIED->JOB_STATE_QUEUED",
                                                    "state JOB_STATE_QUEUED->JOB_STATE_CANCELLED"));
  EXPECT_OK(manager_->Cancel(running));
  ASSERT_TRUE(WaitForState(running, v1::JOB_STATE_CANCELLED));
}

TEST_F(JobManagerTest, CancelOfARunningJobStopsItCancelled) {
  JobManagerOptions options = Options();
  options.step_delay = absl::Milliseconds(20);
  StartManager(options);
  const std::string id = SubmitOrDie(SmallSpec("toy", kEndless));
  ASSERT_TRUE(WaitForSteps(id, 1));

  absl::StatusOr<v1::Job> answer = manager_->Cancel(id);
  ASSERT_OK(answer);
  // The trainer notices between steps; until then the job still runs.
  EXPECT_THAT(answer->state(), ::testing::AnyOf(v1::JOB_STATE_RUNNING, v1::JOB_STATE_CANCELLED));
  v1::Job job;
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_CANCELLED, &job));
  EXPECT_EQ(job.reason(), "cancelled by request");
  EXPECT_GE(job.global_step(), 1);
  EXPECT_LT(job.epochs_done(), kEndless);
  EXPECT_THAT(observer_.States(id), ElementsAre("state JOB_STATE_UNSPECIFIED->JOB_STATE_QUEUED",
                                                "state JOB_STATE_QUEUED->JOB_STATE_RUNNING",
                                                "state JOB_STATE_RUNNING->JOB_STATE_CANCELLED"));
  absl::StatusOr<v1::Job> stored = store_->GetJob(id);
  ASSERT_OK(stored);
  EXPECT_EQ(stored->state(), v1::JOB_STATE_CANCELLED);
}

// A cancel writes a checkpoint of where the job stopped, so a resume loses nothing.
TEST_F(JobManagerTest, CancelOfARunningJobCheckpointsFirstAndResumeGoesOnFromThere) {
  JobManagerOptions options = Options();
  options.step_delay = absl::Milliseconds(20);
  StartManager(options);
  const std::string id = SubmitOrDie(SmallSpec("toy", 4));
  ASSERT_TRUE(WaitForSteps(id, 3));
  ASSERT_OK(manager_->Cancel(id));
  v1::Job job;
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_CANCELLED, &job));
  std::vector<v1::Checkpoint> checkpoints = CheckpointsOf(id);
  ASSERT_EQ(checkpoints.size(), 1u);
  EXPECT_EQ(checkpoints[0].kind(), v1::CHECKPOINT_KIND_CANCEL);
  EXPECT_EQ(checkpoints[0].global_step(), job.global_step());
  EXPECT_TRUE(fs::exists(checkpoints[0].path())) << checkpoints[0].path();

  ASSERT_OK(manager_->Resume(id, 0, 0));
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED, &job));
  EXPECT_EQ(job.resumed_from_step(), checkpoints[0].global_step());
  EXPECT_EQ(job.global_step(), 4 * kStepsPerEpoch);
}

TEST_F(JobManagerTest, CancelOfAFinishedJobIsFailedPreconditionAndChangesNothing) {
  StartManager(Options());
  const std::string id = SubmitOrDie(SmallSpec("toy", 1));
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED));

  absl::StatusOr<v1::Job> answer = manager_->Cancel(id);
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kFailedPrecondition) << answer.status();
  EXPECT_THAT(std::string(answer.status().message()), HasSubstr("already ended"));
  EXPECT_THAT(std::string(answer.status().message()), HasSubstr("only queued or running jobs"));
  v1::Job job;
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED, &job));
  EXPECT_EQ(job.reason(), "");
  EXPECT_EQ(manager_->Cancel("job-nosuchjob").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobManagerTest, QueueLimitRefusesOneWaitingJobTooManyUntilACancelMakesRoom) {
  constexpr int kMaxQueued = 2;
  JobManagerOptions options = Options();
  options.step_delay = absl::Milliseconds(20);
  options.max_jobs_per_device = 1;
  options.max_queued_jobs = kMaxQueued;
  StartManager(options);
  // The first runs (it leaves the queue as it starts); the next kMaxQueued wait.
  const std::string running = SubmitOrDie(SmallSpec("toy", kEndless));
  ASSERT_TRUE(WaitForState(running, v1::JOB_STATE_RUNNING));
  std::vector<std::string> waiting;
  for (int i = 0; i < kMaxQueued; ++i) {
    waiting.push_back(SubmitOrDie(SmallSpec("toy", 1)));
    ASSERT_TRUE(WaitForState(waiting.back(), v1::JOB_STATE_QUEUED));
  }
  const size_t jobs = JobCount();

  absl::StatusOr<v1::Job> refused = manager_->Submit(SmallSpec("toy", 1));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr(absl::StrCat("limit ", kMaxQueued)));
  EXPECT_EQ(JobCount(), jobs) << "a refused job is not stored";

  ASSERT_OK(manager_->Cancel(waiting.front()));
  absl::StatusOr<v1::Job> admitted = manager_->Submit(SmallSpec("toy", 1));
  ASSERT_OK(admitted);
  EXPECT_EQ(admitted->state(), v1::JOB_STATE_QUEUED);
  // Full again.
  EXPECT_EQ(manager_->Submit(SmallSpec("toy", 1)).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_OK(manager_->Cancel(running));
  ASSERT_TRUE(WaitForState(running, v1::JOB_STATE_CANCELLED));
}

TEST_F(JobManagerTest, CancelledJobResumedWithMoreEpochsContinuesFromItsLatestCheckpoint) {
  JobManagerOptions options = Options();
  options.step_delay = absl::Milliseconds(10);
  StartManager(options);
  v1::JobSpec spec = SmallSpec("toy", kEndless);
  spec.mutable_checkpoint_policy()->set_every_n_epochs(1);
  const std::string id = SubmitOrDie(spec);
  ASSERT_TRUE(WaitFor([&] { return !CheckpointsOf(id).empty(); }, kWait));
  ASSERT_OK(manager_->Cancel(id));
  v1::Job cancelled;
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_CANCELLED, &cancelled));
  const v1::Checkpoint latest = CheckpointsOf(id).back();
  ASSERT_GT(latest.global_step(), 0);

  // Two epochs more than it had finished when it was cancelled.
  const int epochs = cancelled.epochs_done() + 2;
  absl::StatusOr<v1::Job> resumed = manager_->Resume(id, epochs);
  ASSERT_OK(resumed);
  EXPECT_EQ(resumed->state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(resumed->reason(), "resumed by request");
  EXPECT_EQ(resumed->epochs(), epochs);
  v1::Job job;
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED, &job));
  EXPECT_EQ(job.attempts(), 2);
  EXPECT_EQ(job.resumed_from_step(), latest.global_step());
  EXPECT_EQ(job.epochs(), epochs);
  EXPECT_EQ(job.epochs_done(), epochs);
  EXPECT_EQ(job.global_step(), int64_t{epochs} * kStepsPerEpoch);
}

TEST_F(JobManagerTest, SucceededJobResumedWithMoreEpochsTrainsThemFromItsFinalCheckpoint) {
  StartManager(Options());
  const std::string id = SubmitOrDie(SmallSpec("toy", 2));
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED));

  // Not more epochs than it has: nothing to resume.
  EXPECT_EQ(manager_->Resume(id, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager_->Resume(id, 2).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_OK(manager_->Resume(id, 4));
  v1::Job job;
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED, &job));
  EXPECT_EQ(job.attempts(), 2);
  EXPECT_EQ(job.resumed_from_step(), 2 * kStepsPerEpoch);
  EXPECT_EQ(job.epochs(), 4);
  EXPECT_EQ(job.epochs_done(), 4);
  EXPECT_EQ(job.global_step(), 4 * kStepsPerEpoch);
  EXPECT_EQ(CheckpointsOf(id).back().global_step(), 4 * kStepsPerEpoch);
}

TEST_F(JobManagerTest, ResumeOfAJobWhoseDatasetWasDeletedIsRefusedNamingTheDataset) {
  StartManager(Options());
  const std::string id = SubmitOrDie(SmallSpec("toy", 1));
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED));
  fs::remove_all(root_ + "/data/toy");

  absl::StatusOr<v1::Job> refused = manager_->Resume(id, 2);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("dataset \"toy\""));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("no longer exists"));
  absl::StatusOr<v1::Job> job = manager_->Get(id);
  ASSERT_OK(job);
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << "a refused resume changes nothing";
}

TEST_F(JobManagerTest, ShutdownLeavesTheRunningJobRunningAndARestartResumesItFromItsCheckpoint) {
  JobManagerOptions slow = Options();
  slow.step_delay = absl::Milliseconds(100);  // 32 steps: over 3 s to stop it in the middle
  StartManager(slow);
  const std::string id = SubmitOrDie(SmallSpec("toy", 4));
  ASSERT_TRUE(WaitForSteps(id, 1));
  ASSERT_OK(manager_->Shutdown(kWait));
  EXPECT_EQ(manager_->Submit(SmallSpec("toy", 1)).status().code(), absl::StatusCode::kUnavailable);

  absl::StatusOr<v1::Job> stored = store_->GetJob(id);
  ASSERT_OK(stored);
  ASSERT_EQ(stored->state(), v1::JOB_STATE_RUNNING) << "to resume on restart";
  // The policy's default: a checkpoint on shutdown.
  std::vector<v1::Checkpoint> checkpoints = CheckpointsOf(id);
  ASSERT_EQ(checkpoints.size(), 1u);
  const v1::Checkpoint shutdown = checkpoints[0];
  EXPECT_EQ(shutdown.kind(), v1::CHECKPOINT_KIND_SHUTDOWN);
  EXPECT_GT(shutdown.global_step(), 0);
  EXPECT_LT(shutdown.global_step(), 4 * kStepsPerEpoch) << "the job ended before the shutdown";
  EXPECT_TRUE(fs::exists(shutdown.path())) << shutdown.path();

  StartManager(Options());  // a new manager on the same store and state dir, at full speed
  v1::Job job;
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED, &job));
  EXPECT_EQ(job.attempts(), 2);
  EXPECT_EQ(job.resumed_from_step(), shutdown.global_step());
  EXPECT_EQ(job.epochs_done(), 4);
  EXPECT_EQ(job.global_step(), 4 * kStepsPerEpoch);
  EXPECT_THAT(observer_.Lines(id),
              ::testing::IsSupersetOf(
                  {"recovered JOB_STATE_RUNNING", "state JOB_STATE_RUNNING->JOB_STATE_QUEUED"}));
  // Both managers told the one observer: the first run, then the restart and the second run.
  EXPECT_THAT(observer_.States(id), ElementsAre("state JOB_STATE_UNSPECIFIED->JOB_STATE_QUEUED",
                                                "state JOB_STATE_QUEUED->JOB_STATE_RUNNING",
                                                "state JOB_STATE_RUNNING->JOB_STATE_QUEUED",
                                                "state JOB_STATE_QUEUED->JOB_STATE_RUNNING",
                                                "state JOB_STATE_RUNNING->JOB_STATE_SUCCEEDED"));
}

TEST_F(JobManagerTest, JobThatFinishedBeforeARestartCanBeResumedAfterIt) {
  StartManager(Options());
  const std::string id = SubmitOrDie(SmallSpec("toy", 1));
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED));

  StartManager(Options());
  ASSERT_OK(manager_->Resume(id, 3));
  v1::Job job;
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED, &job));
  EXPECT_EQ(job.attempts(), 2);
  EXPECT_EQ(job.resumed_from_step(), kStepsPerEpoch);
  EXPECT_EQ(job.epochs_done(), 3);
  EXPECT_EQ(job.global_step(), 3 * kStepsPerEpoch);
}

TEST_F(JobManagerTest, ResumedJobInterruptedByARestartKeepsItsNewEpochCount) {
  JobManagerOptions slow = Options();
  slow.step_delay = absl::Milliseconds(100);  // 24 more steps: over 2 s to stop it in the middle
  StartManager(slow);
  const std::string id = SubmitOrDie(SmallSpec("toy", 1));
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED));
  ASSERT_OK(manager_->Resume(id, 4));
  ASSERT_TRUE(WaitForSteps(id, kStepsPerEpoch + 1));
  ASSERT_OK(manager_->Shutdown(kWait));
  const v1::Checkpoint shutdown = CheckpointsOf(id).back();
  ASSERT_EQ(shutdown.kind(), v1::CHECKPOINT_KIND_SHUTDOWN);
  ASSERT_LT(shutdown.global_step(), 4 * kStepsPerEpoch) << "the job ended before the shutdown";

  StartManager(Options());
  v1::Job job;
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED, &job));
  EXPECT_EQ(job.attempts(), 3);
  EXPECT_EQ(job.resumed_from_step(), shutdown.global_step());
  EXPECT_EQ(job.epochs(), 4);
  EXPECT_EQ(job.epochs_done(), 4);
  EXPECT_EQ(job.global_step(), 4 * kStepsPerEpoch);
}

TEST_F(JobManagerTest, RestartFailsAJobWhoseSpecNoLongerPassesTheLimits) {
  JobManagerOptions options = Options();
  options.step_delay = absl::Milliseconds(20);
  StartManager(options);
  const std::string running = SubmitOrDie(SmallSpec("toy", kEndless));
  const std::string queued = SubmitOrDie(SmallSpec("toy", 1));
  ASSERT_TRUE(WaitForSteps(running, 1));
  ASSERT_OK(manager_->Shutdown(kWait));

  JobManagerOptions tighter = Options();
  tighter.limits.max_parameters = 1000;  // SmallSpec's MLP has over 25,000
  StartManager(tighter);
  for (const std::string& id : {running, queued}) {
    v1::Job job;
    ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_FAILED, &job));
    EXPECT_THAT(job.reason(), StartsWith("spec refused after restart"));
    EXPECT_THAT(job.reason(), HasSubstr("max_parameters"));
    absl::StatusOr<v1::Job> stored = store_->GetJob(id);
    ASSERT_OK(stored);
    EXPECT_EQ(stored->state(), v1::JOB_STATE_FAILED);
  }
  EXPECT_THAT(observer_.States(running),
              ::testing::Contains("state JOB_STATE_RUNNING->JOB_STATE_FAILED"));
  EXPECT_THAT(observer_.States(queued),
              ::testing::Contains("state JOB_STATE_QUEUED->JOB_STATE_FAILED"));
}

TEST_F(JobManagerTest, CheckpointPolicyKeepsTheLastKPeriodicAndTheBestAndDeletesPrunedFiles) {
  constexpr int kEpochs = 5;
  StartManager(Options());
  v1::JobSpec spec = SmallSpec("toy", kEpochs);
  spec.mutable_checkpoint_policy()->set_every_n_epochs(1);
  spec.mutable_checkpoint_policy()->set_keep_last(2);
  spec.mutable_checkpoint_policy()->set_keep_best(true);
  const std::string id = SubmitOrDie(spec);
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED));

  std::vector<int> periodic;
  int best = 0;
  std::vector<std::string> kept;
  for (const v1::Checkpoint& c : CheckpointsOf(id)) {
    EXPECT_TRUE(fs::exists(c.path())) << c.path();
    kept.push_back(c.path());
    if (c.kind() == v1::CHECKPOINT_KIND_PERIODIC) periodic.push_back(c.epochs_done());
    if (c.kind() == v1::CHECKPOINT_KIND_BEST) ++best;
    // The last periodic checkpoint is of the final model: no FINAL one besides.
    EXPECT_NE(c.kind(), v1::CHECKPOINT_KIND_FINAL);
  }
  EXPECT_EQ(periodic, (std::vector<int>{kEpochs - 1, kEpochs}));
  EXPECT_EQ(best, 1);

  // Every checkpoint written was announced; those no longer listed are gone from disk.
  int periodic_written = 0;
  for (const v1::Checkpoint& c : observer_.Checkpoints(id)) {
    if (c.kind() == v1::CHECKPOINT_KIND_PERIODIC) ++periodic_written;
    if (std::find(kept.begin(), kept.end(), c.path()) == kept.end()) {
      EXPECT_FALSE(fs::exists(c.path())) << "pruned but still on disk: " << c.path();
    }
  }
  EXPECT_EQ(periodic_written, kEpochs);
  const fs::path dir = fs::path(state_dir_) / "checkpoints" / id;
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()),
            static_cast<std::ptrdiff_t>(kept.size()));
}

TEST_F(JobManagerTest, RequestCheckpointOfARunningJobWritesAnOnDemandCheckpoint) {
  JobManagerOptions options = Options();
  options.step_delay = absl::Milliseconds(20);
  StartManager(options);
  const std::string id = SubmitOrDie(SmallSpec("toy", kEndless));
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_RUNNING));

  std::mutex mu;
  std::optional<absl::StatusOr<v1::Checkpoint>> result;
  manager_->RequestCheckpoint(id, [&](absl::StatusOr<v1::Checkpoint> c) {
    std::lock_guard<std::mutex> lock(mu);
    result = std::move(c);
  });
  ASSERT_TRUE(WaitFor(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return result.has_value();
      },
      kWait));
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_OK(*result);
  const v1::Checkpoint& c = **result;
  EXPECT_EQ(c.kind(), v1::CHECKPOINT_KIND_ON_DEMAND);
  EXPECT_EQ(c.job_id(), id);
  EXPECT_GT(c.id(), 0);
  EXPECT_GT(c.global_step(), 0);
  EXPECT_TRUE(fs::exists(c.path())) << c.path();
  EXPECT_EQ(static_cast<int64_t>(fs::file_size(c.path())), c.size_bytes());
  const std::vector<v1::Checkpoint> listed = CheckpointsOf(id);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].id(), c.id());
  ASSERT_OK(manager_->Cancel(id));
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_CANCELLED));
}

TEST_F(JobManagerTest, RequestCheckpointOfAFinishedJobIsFailedPrecondition) {
  StartManager(Options());
  const std::string id = SubmitOrDie(SmallSpec("toy", 1));
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED));

  // On error the callback runs on the caller's thread, before RequestCheckpoint returns.
  std::optional<absl::StatusOr<v1::Checkpoint>> result;
  manager_->RequestCheckpoint(id, [&](absl::StatusOr<v1::Checkpoint> c) { result = std::move(c); });
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status().code(), absl::StatusCode::kFailedPrecondition) << result->status();
  EXPECT_THAT(std::string(result->status().message()),
              HasSubstr("only a running job can be checkpointed"));

  result.reset();
  manager_->RequestCheckpoint("job-nosuchjob",
                              [&](absl::StatusOr<v1::Checkpoint> c) { result = std::move(c); });
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status().code(), absl::StatusCode::kNotFound) << result->status();
  EXPECT_EQ(CheckpointsOf(id).size(), 1u) << "only the final one";
}

// Flips one byte in the middle of a file, as a failing disk would.
void DamageFile(const std::string& path) {
  std::string bytes = ReadFile(path);
  ASSERT_FALSE(bytes.empty());
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x5a);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST_F(JobManagerTest, CheckpointsRecordTheirSha256AndADamagedOneIsNotExported) {
  StartManager(Options());
  const std::string id = SubmitOrDie(SmallSpec("toy", 1));
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED));
  const v1::Checkpoint latest = CheckpointsOf(id).back();
  EXPECT_EQ(latest.sha256(), *Sha256OfFile(latest.path()));
  DamageFile(latest.path());

  absl::StatusOr<std::unique_ptr<CheckpointExport>> exported =
      manager_->ExportCheckpoint(id, 0, 1 << 20);
  ASSERT_OK(exported);
  v1::CheckpointChunk chunk;
  absl::Status status;
  while (status.ok() && !(*exported)->done()) status = (*exported)->Next(&chunk);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("the file was damaged on disk"));
  EXPECT_THAT(std::string(status.message()), HasSubstr(latest.path()));
  EXPECT_TRUE(chunk.sha256().empty()) << "no digest of the damaged bytes is sent";
}

TEST_F(JobManagerTest, ResumePassesOverADamagedLatestCheckpointForTheNewestThatVerifies) {
  JobManagerOptions options = Options();
  options.step_delay = absl::Milliseconds(10);
  StartManager(options);
  v1::JobSpec spec = SmallSpec("toy", kEndless);
  spec.mutable_checkpoint_policy()->set_every_n_epochs(1);
  const std::string id = SubmitOrDie(spec);
  ASSERT_TRUE(WaitFor([&] { return CheckpointsOf(id).size() >= 2; }, kWait));
  ASSERT_OK(manager_->Cancel(id));
  v1::Job cancelled;
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_CANCELLED, &cancelled));
  std::vector<v1::Checkpoint> checkpoints = CheckpointsOf(id);
  // Newest written first, which is what a resume starts from. (A cancel landing at an epoch's
  // end writes its checkpoint at the same step as the epoch's: the order is by id, not step.)
  std::sort(checkpoints.begin(), checkpoints.end(),
            [](const auto& a, const auto& b) { return a.id() > b.id(); });
  ASSERT_GE(checkpoints.size(), 2u);
  DamageFile(checkpoints[0].path());

  ASSERT_OK(manager_->Resume(id, cancelled.epochs_done() + 2));
  ASSERT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<v1::Job> job = manager_->Get(id);
        return job.ok() && job->state() == v1::JOB_STATE_RUNNING && job->attempts() == 2 &&
               !job->reason().empty();
      },
      kWait));
  v1::Job running = *manager_->Get(id);
  EXPECT_EQ(running.resumed_from_step(), checkpoints[1].global_step());
  EXPECT_THAT(running.reason(),
              HasSubstr(absl::StrCat("resumed from checkpoint ", checkpoints[1].id(), " (step ")));
  EXPECT_THAT(running.reason(),
              HasSubstr(absl::StrCat("passing over checkpoint ", checkpoints[0].id(), ": ")));
  EXPECT_THAT(running.reason(), HasSubstr("damaged on disk"));
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED));
}

TEST_F(JobManagerTest, ResumeFromANamedOlderCheckpointRetrainsFromItAndFollowsItsOwnLine) {
  StartManager(Options());
  std::string id;
  std::vector<v1::Checkpoint> before;
  ASSERT_NO_FATAL_FAILURE(TrainWithACheckpointAnEpoch(3, &id, &before));
  const v1::Checkpoint first = before.front();  // epoch 1
  ASSERT_EQ(first.epochs_done(), 1);

  // Its epochs count against the checkpoint's, not the job's: 2 epochs from epoch 1 is work.
  ASSERT_OK(manager_->Resume(id, 2, first.id()));
  v1::Job job;
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED, &job));
  EXPECT_EQ(job.resumed_from_step(), first.global_step());
  EXPECT_EQ(job.epochs_done(), 2);
  EXPECT_EQ(job.global_step(), 2 * kStepsPerEpoch);
  EXPECT_EQ(job.resume_checkpoint_id(), 0) << "the pin outlived the run's own checkpoints";

  // The line it followed is the newest written, though the abandoned one went further: a plain
  // resume continues from the end of the new line.
  const v1::Checkpoint newest = CheckpointsOf(id).back();
  EXPECT_GT(newest.id(), before.back().id());
  EXPECT_LT(newest.global_step(), before.back().global_step());
  ASSERT_OK(manager_->Resume(id, 4));
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED, &job));
  EXPECT_EQ(job.resumed_from_step(), newest.global_step());
}

TEST_F(JobManagerTest, ResumeFromAnUnknownOrDamagedCheckpointIsRefusedAndChangesNothing) {
  StartManager(Options());
  std::string id;
  std::vector<v1::Checkpoint> checkpoints;
  ASSERT_NO_FATAL_FAILURE(TrainWithACheckpointAnEpoch(2, &id, &checkpoints));

  absl::Status unknown = manager_->Resume(id, 4, 987654).status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound) << unknown;
  EXPECT_THAT(unknown.message(), HasSubstr("checkpoint 987654"));
  DamageFile(checkpoints.front().path());
  absl::Status damaged = manager_->Resume(id, 4, checkpoints.front().id()).status();
  EXPECT_EQ(damaged.code(), absl::StatusCode::kDataLoss) << damaged;
  // From the checkpoint at epoch 2 of 2: no epochs left to train.
  absl::Status done = manager_->Resume(id, 2, checkpoints.back().id()).status();
  EXPECT_EQ(done.code(), absl::StatusCode::kFailedPrecondition) << done;
  v1::Job job = *manager_->Get(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(job.attempts(), 1);
  EXPECT_EQ(job.resume_checkpoint_id(), 0);
}

TEST_F(JobManagerTest, DeleteCheckpointRemovesItsFileAndEntryButNotThePinOfAQueuedJob) {
  StartManager(Options());
  std::string id;
  std::vector<v1::Checkpoint> checkpoints;
  ASSERT_NO_FATAL_FAILURE(TrainWithACheckpointAnEpoch(2, &id, &checkpoints));

  absl::StatusOr<v1::Checkpoint> deleted = manager_->DeleteCheckpoint(id, checkpoints.front().id());
  ASSERT_OK(deleted);
  EXPECT_EQ(deleted->id(), checkpoints.front().id());
  EXPECT_FALSE(fs::exists(checkpoints.front().path()));
  EXPECT_EQ(CheckpointsOf(id).size(), checkpoints.size() - 1);
  EXPECT_EQ(manager_->DeleteCheckpoint(id, checkpoints.front().id()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(manager_->DeleteCheckpoint("job-nope", 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager_->Resume(id, 4, checkpoints.front().id()).status().code(),
            absl::StatusCode::kNotFound);

  // A job waiting to resume from a checkpoint keeps it: a second job holds the one device.
  const v1::Checkpoint pinned = checkpoints.back();
  const std::string blocker = SubmitOrDie(SmallSpec("toy", kEndless));
  ASSERT_TRUE(WaitForState(blocker, v1::JOB_STATE_RUNNING));
  ASSERT_OK(manager_->Resume(id, 3, pinned.id()));
  StartManager(Options());  // a restart keeps the pin: it is in the store
  EXPECT_EQ(manager_->Get(id)->resume_checkpoint_id(), pinned.id());
  absl::Status refused = manager_->DeleteCheckpoint(id, pinned.id()).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("resumes from"));
  EXPECT_TRUE(fs::exists(pinned.path()));
  ASSERT_OK(manager_->Cancel(blocker));
  v1::Job job;
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED, &job));
  EXPECT_EQ(job.resumed_from_step(), pinned.global_step());
}

TEST_F(JobManagerTest, ExportedChunksReassembleTheCheckpointFileWithItsSha256) {
  StartManager(Options());
  const std::string id = SubmitOrDie(SmallSpec("toy", 1));
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED));
  const v1::Checkpoint latest = CheckpointsOf(id).back();
  const std::string file = ReadFile(latest.path());
  constexpr int kChunkBytes = 4096;
  ASSERT_GT(file.size(), 2u * kChunkBytes) << "the test wants several chunks";

  absl::StatusOr<std::unique_ptr<CheckpointExport>> exported =
      manager_->ExportCheckpoint(id, 0, kChunkBytes);
  ASSERT_OK(exported);
  std::vector<v1::CheckpointChunk> chunks;
  while (!(*exported)->done()) {
    ASSERT_OK((*exported)->Next(&chunks.emplace_back()));
    ASSERT_LE(chunks.size(), file.size() / kChunkBytes + 2) << "it does not end";
  }
  ASSERT_FALSE(chunks.empty());
  std::string joined;
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i].offset(), static_cast<int64_t>(joined.size())) << "chunk " << i;
    EXPECT_LE(chunks[i].data().size(), static_cast<size_t>(kChunkBytes));
    EXPECT_EQ(chunks[i].has_checkpoint(), i == 0) << "chunk " << i;
    EXPECT_EQ(chunks[i].sha256().empty(), i + 1 < chunks.size()) << "chunk " << i;
    joined += chunks[i].data();
  }
  EXPECT_TRUE(joined == file) << "the chunks' " << joined.size() << " bytes differ from the file's "
                              << file.size();
  EXPECT_EQ(chunks.front().checkpoint().id(), latest.id());
  EXPECT_EQ(chunks.front().checkpoint().path(), latest.path());
  absl::StatusOr<std::string> sha = Sha256OfFile(latest.path());
  ASSERT_OK(sha);
  EXPECT_EQ(chunks.back().sha256(), *sha);

  // The same checkpoint by its id.
  ASSERT_OK(manager_->ExportCheckpoint(id, latest.id(), kChunkBytes));
}

TEST_F(JobManagerTest, ExportOfAnUnknownCheckpointOrJobIsNotFound) {
  StartManager(Options());
  const std::string id = SubmitOrDie(SmallSpec("toy", 1));
  ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED));
  const int64_t unknown = CheckpointsOf(id).back().id() + 1000;

  absl::StatusOr<std::unique_ptr<CheckpointExport>> exported =
      manager_->ExportCheckpoint(id, unknown, 4096);
  EXPECT_EQ(exported.status().code(), absl::StatusCode::kNotFound) << exported.status();
  EXPECT_THAT(std::string(exported.status().message()),
              HasSubstr(absl::StrCat("checkpoint ", unknown)));
  EXPECT_EQ(manager_->ExportCheckpoint("job-nosuchjob", 0, 4096).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(JobManagerTest, SubmissionWithoutADatasetIsInvalidArgumentAndStoresNothing) {
  StartManager(Options());
  absl::StatusOr<v1::Job> refused = manager_->Submit(SmallSpec("", 1));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), StartsWith("spec.dataset: required"));
  EXPECT_EQ(JobCount(), 0u);
  EXPECT_EQ(observer_.size(), 0u);
}

TEST_F(JobManagerTest, SubmissionOfAnUnknownDatasetIsNotFoundAndStoresNothing) {
  StartManager(Options());
  absl::StatusOr<v1::Job> refused = manager_->Submit(SmallSpec("no-such-dataset", 1));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kNotFound) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), StartsWith("spec.dataset: "));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("no-such-dataset"));
  EXPECT_EQ(JobCount(), 0u);
  EXPECT_EQ(observer_.size(), 0u);
}

// Classes that only the test split has count too: a model without outputs for them is refused at
// submission, not found out at the end of the first epoch.
TEST_F(JobManagerTest, TestSplitLabelsBeyondTheModelsOutputsAreRefusedAtSubmission) {
  // Train labels 0..4, test labels 0..9.
  testing::WriteToyDataset(root_ + "/data/split", 64, 64);
  std::string labels(8, '\0');
  labels[2] = 0x08;  // 00 00 08 01, then 64 big-endian
  labels[3] = 0x01;
  labels[7] = 64;
  for (int i = 0; i < 64; ++i) labels.push_back(static_cast<char>(i % 5));
  std::ofstream(root_ + "/data/split/train-labels-idx1-ubyte", std::ios::binary | std::ios::trunc)
      << labels;
  StartManager(Options());
  v1::JobSpec spec = SmallSpec("split", 1);
  spec.mutable_model()->mutable_layers(2)->mutable_linear()->set_out_features(5);
  absl::StatusOr<v1::Job> refused = manager_->Submit(spec);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("model has 5 outputs but the dataset \"split\" labels go up to 9"));
  EXPECT_EQ(JobCount(), 0u);
}

// Crop and flip need images the padding fits, which only the dataset tells: a padding over half
// of the toy dataset's 28x28 images and augmentation of a CSV table are refused at submission,
// naming spec.augment; crop and flip of the images train.
TEST_F(JobManagerTest, AugmentIsCheckedAgainstTheDatasetAtSubmission) {
  fs::create_directories(root_ + "/data/table");
  std::ofstream table(root_ + "/data/table/train.csv");
  table << "a,b,c,d,label\n";
  for (int i = 0; i < 40; ++i) table << i << ",1,2,3," << i % 2 << "\n";
  table.close();
  StartManager(Options());

  v1::JobSpec spec = SmallSpec("toy", 1);  // an MLP on 28x28 images
  spec.mutable_augment()->set_random_crop_padding(15);
  absl::StatusOr<v1::Job> refused = manager_->Submit(spec);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              StartsWith("spec.augment: dataset \"toy\": random_crop_padding must be in [0, 14] "
                         "for 28x28 images"));

  v1::JobSpec on_table = SmallSpec("table", 1);
  v1::ModelSpec* m = on_table.mutable_model();
  m->Clear();
  m->add_input_shape(4);
  m->add_layers()->mutable_linear()->set_in_features(4);
  m->mutable_layers(0)->mutable_linear()->set_out_features(2);
  on_table.mutable_augment()->set_horizontal_flip(true);
  refused = manager_->Submit(on_table);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              StartsWith("spec.augment: dataset \"table\": random crop and horizontal flip need "
                         "images, but the dataset holds float feature rows (a table)"));
  EXPECT_EQ(JobCount(), 0u);

  spec.mutable_augment()->set_random_crop_padding(4);
  spec.mutable_augment()->set_horizontal_flip(true);
  absl::StatusOr<v1::Job> submitted = manager_->Submit(spec);
  ASSERT_OK(submitted) << submitted.status();
  EXPECT_TRUE(WaitForState(submitted->id(), v1::JOB_STATE_SUCCEEDED));
}

// A batchnorm1d between the linears: a batch size that leaves a last batch of one sample is
// refused at submission; a good one trains, and the final checkpoint carries the running
// statistics, which a resumed model or a served one loads.
TEST_F(JobManagerTest, BatchNormJobsAreCheckedAtSubmissionAndCheckpointTheirStatistics) {
  StartManager(Options());
  v1::JobSpec spec = SmallSpec("toy", 1);
  v1::ModelSpec* m = spec.mutable_model();
  ASSERT_EQ(m->layers_size(), 3);  // linear 784-32, relu, linear 32-10
  const v1::Layer first = m->layers(0), relu = m->layers(1), last = m->layers(2);
  m->clear_layers();
  *m->add_layers() = first;
  m->add_layers()->mutable_batchnorm1d()->set_num_features(32);
  *m->add_layers() = relu;
  *m->add_layers() = last;
  spec.set_batch_size(kTrainSamples - 1);
  absl::StatusOr<v1::Job> refused = manager_->Submit(spec);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              StartsWith("spec.batch_size: layer 1 batchnorm1d: 256 training samples in batches "
                         "of 255 make a batch of 1 sample"));
  EXPECT_EQ(JobCount(), 0u);

  spec.set_batch_size(32);
  absl::StatusOr<v1::Job> submitted = manager_->Submit(spec);
  ASSERT_OK(submitted) << submitted.status();
  v1::Job job;
  ASSERT_TRUE(WaitForState(submitted->id(), v1::JOB_STATE_SUCCEEDED, &job));
  EXPECT_EQ(job.parameter_count(), 784 * 32 + 32 + 2 * 32 + 32 * 10 + 10);
  const std::vector<v1::Checkpoint> checkpoints = CheckpointsOf(submitted->id());
  ASSERT_EQ(checkpoints.size(), 1u);
  absl::StatusOr<SafetensorsContents> file = ReadSafetensors(checkpoints[0].path());
  ASSERT_OK(file);
  for (const char* name : {"1.running_mean", "1.running_var"}) {
    EXPECT_NE(file->Find(name), nullptr) << name;
  }
  const HostTensor* count = file->Find("1.num_batches_tracked");
  ASSERT_NE(count, nullptr);
  ASSERT_EQ(count->bytes.size(), 8u);
  int64_t steps = 0;
  std::memcpy(&steps, count->bytes.data(), 8);
  EXPECT_EQ(steps, kTrainSamples / 32);
}

TEST_F(JobManagerTest, SubmissionOfAModelThatDoesNotFitTheDatasetIsRefusedAndStoresNothing) {
  StartManager(Options());
  // A 10x10 input where the dataset's samples are 28x28.
  v1::JobSpec spec = SmallSpec("toy", 1);
  spec.mutable_model()->set_input_shape(0, 100);
  spec.mutable_model()->mutable_layers(0)->mutable_linear()->set_in_features(100);
  absl::StatusOr<v1::Job> refused = manager_->Submit(spec);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), StartsWith("spec.model.input_shape: "));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("\"toy\""));

  // Fewer outputs than the dataset has classes.
  spec = SmallSpec("toy", 1);
  spec.mutable_model()->mutable_layers(2)->mutable_linear()->set_out_features(5);
  refused = manager_->Submit(spec);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), StartsWith("spec.model: "));
  EXPECT_EQ(JobCount(), 0u);
  EXPECT_EQ(observer_.size(), 0u);
  absl::StatusOr<std::vector<v1::Job>> stored = store_->AllJobs();
  ASSERT_OK(stored);
  EXPECT_TRUE(stored->empty());
}

}  // namespace
}  // namespace kiln::server
