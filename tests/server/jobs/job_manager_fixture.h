// The job manager's test fixture, shared by its test files: a JobStore in a temporary state
// dir, a catalog holding one tiny IDX dataset, a recording JobEventObserver, and waits on a job's
// state and steps.
#pragma once

#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/datasets/dataset_catalog.h"
#include "server/jobs/job_event_observer.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/job_store.h"
#include "server/jobs/job_vocabulary.h"
#include "server/jobs/metric_broadcaster.h"
#include "server_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::server::testing {

namespace fs = std::filesystem;

// Long enough for a loaded 2-core machine; the tests poll and never rely on it otherwise.
constexpr absl::Duration kWait = absl::Seconds(60);
// The toy dataset: 256 training samples in batches of 32 (SmallSpec) make 8 steps an epoch.
constexpr int kTrainSamples = 256;
constexpr int kStepsPerEpoch = 8;
// Epochs for a job meant to be cancelled or stopped long before it could finish.
constexpr int kEndless = 5000;

// What one job event was, as a line: "state QUEUED->RUNNING", "checkpoint FINAL step 16".
class RecordingObserver : public JobEventObserver {
 public:
  void OnRecovered(const v1::Job& job) override {
    Add(job.id(), absl::StrCat("recovered ", v1::JobState_Name(job.state())));
  }
  void OnSubmitted(const v1::Job& job) override { Add(job.id(), "submitted"); }
  void OnStateChanged(const v1::Job& job, v1::JobState from) override {
    Add(job.id(),
        absl::StrCat("state ", v1::JobState_Name(from), "->", v1::JobState_Name(job.state())));
  }
  void OnCheckpoint(const v1::Checkpoint& checkpoint, double /*seconds*/) override {
    std::lock_guard<std::mutex> lock(mu_);
    checkpoints_.push_back(checkpoint);
    lines_.emplace_back(checkpoint.job_id(),
                        absl::StrCat("checkpoint ", v1::CheckpointKind_Name(checkpoint.kind()),
                                     " step ", checkpoint.global_step()));
  }

  // The job's lines, in the order they came.
  std::vector<std::string> Lines(const std::string& job_id) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto& [id, line] : lines_) {
      if (id == job_id) out.push_back(line);
    }
    return out;
  }
  // Only its state changes.
  std::vector<std::string> States(const std::string& job_id) const {
    std::vector<std::string> out;
    for (std::string& line : Lines(job_id)) {
      if (line.starts_with("state ")) out.push_back(std::move(line));
    }
    return out;
  }
  // The jobs in the order they started running (a job twice when it started twice).
  std::vector<std::string> Started() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto& [id, line] : lines_) {
      if (line == "state JOB_STATE_QUEUED->JOB_STATE_RUNNING") out.push_back(id);
    }
    return out;
  }
  std::vector<v1::Checkpoint> Checkpoints(const std::string& job_id) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<v1::Checkpoint> out;
    for (const v1::Checkpoint& c : checkpoints_) {
      if (c.job_id() == job_id) out.push_back(c);
    }
    return out;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_.size();
  }

 private:
  void Add(const std::string& job_id, std::string line) {
    std::lock_guard<std::mutex> lock(mu_);
    lines_.emplace_back(job_id, std::move(line));
  }

  mutable std::mutex mu_;
  std::vector<std::pair<std::string, std::string>> lines_;
  std::vector<v1::Checkpoint> checkpoints_;
};

class JobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::MakeTempDir("job-manager-test");
    state_dir_ = root_ + "/state";
    fs::create_directories(state_dir_);
    testing::WriteToyDataset(root_ + "/data/toy", kTrainSamples, 64);
    auto store = JobStore::Open(state_dir_ + "/kiln.db");
    ASSERT_OK(store);
    store_ = *std::move(store);
    catalog_ = std::make_unique<DatasetCatalog>(root_ + "/data", int64_t{1} << 30);
  }
  void TearDown() override {
    manager_.reset();  // stops what still runs, before the store goes
    store_.reset();
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  // Options as kilnd would set them, on this test's state dir, told to `observer_`.
  JobManagerOptions Options() {
    JobManagerOptions options;
    options.state_dir = state_dir_;
    options.max_jobs_per_device = 1;
    options.observers = {&observer_};
    return options;
  }
  // Replaces the manager (a restart when there was one) and recovers the store.
  void StartManager(JobManagerOptions options) {
    manager_.reset();
    manager_ = std::make_unique<JobManager>(store_.get(), &broadcaster_, catalog_.get(),
                                            std::move(options));
    ASSERT_OK(manager_->Recover());
  }

  std::string SubmitOrDie(const v1::JobSpec& spec, const v1::Owner& owner = {}) {
    absl::StatusOr<v1::Job> job = manager_->Submit(spec, owner);
    EXPECT_OK(job);
    return job.ok() ? job->id() : "";
  }
  // Polls Get() until the job is in `state`, or in another final state it will not leave;
  // `job`, if given, receives the job as last seen.
  ::testing::AssertionResult WaitForState(const std::string& id, v1::JobState state,
                                          v1::Job* job = nullptr) {
    v1::Job seen;
    absl::Status error;
    WaitFor(
        [&] {
          absl::StatusOr<v1::Job> got = manager_->Get(id);
          if (!got.ok()) {
            error = got.status();
            return false;
          }
          seen = *std::move(got);
          return seen.state() == state || IsFinal(seen.state());
        },
        kWait);
    if (job != nullptr) *job = seen;
    if (seen.state() == state) return ::testing::AssertionSuccess();
    ::testing::AssertionResult failure = ::testing::AssertionFailure();
    failure << "job " << id << " did not reach " << v1::JobState_Name(state) << "; it is "
            << v1::JobState_Name(seen.state()) << " (reason: \"" << seen.reason() << "\")";
    if (!error.ok()) failure << "; Get: " << error;
    return failure;
  }
  // Polls Get() until the job has taken at least `steps` steps (while it has not ended).
  ::testing::AssertionResult WaitForSteps(const std::string& id, int64_t steps) {
    v1::Job seen;
    WaitFor(
        [&] {
          absl::StatusOr<v1::Job> got = manager_->Get(id);
          if (got.ok()) seen = *std::move(got);
          return seen.global_step() >= steps || IsFinal(seen.state());
        },
        kWait);
    if (seen.global_step() >= steps) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "job " << id << " took " << seen.global_step() << " steps, not " << steps
           << "; it is " << v1::JobState_Name(seen.state()) << " (reason: \"" << seen.reason()
           << "\")";
  }
  std::vector<v1::Checkpoint> CheckpointsOf(const std::string& id) {
    absl::StatusOr<std::vector<v1::Checkpoint>> all = manager_->ListCheckpoints(id);
    EXPECT_OK(all);
    return all.ok() ? *std::move(all) : std::vector<v1::Checkpoint>{};
  }
  // Runs a job of `epochs` with a checkpoint every epoch to success; its id and checkpoints (at
  // least one an epoch).
  void TrainWithACheckpointAnEpoch(int epochs, std::string* id,
                                   std::vector<v1::Checkpoint>* checkpoints) {
    v1::JobSpec spec = SmallSpec("toy", epochs);
    spec.mutable_checkpoint_policy()->set_every_n_epochs(1);
    *id = SubmitOrDie(spec);
    ASSERT_TRUE(WaitForState(*id, v1::JOB_STATE_SUCCEEDED));
    *checkpoints = CheckpointsOf(*id);
    ASSERT_GE(checkpoints->size(), static_cast<size_t>(epochs));
  }
  size_t JobCount() {
    absl::StatusOr<JobPage> page = manager_->List({}, 1000, "");
    EXPECT_OK(page);
    return page.ok() ? page->jobs.size() : 0;
  }

  std::string root_, state_dir_;
  std::unique_ptr<JobStore> store_;
  MetricBroadcaster broadcaster_;
  std::unique_ptr<DatasetCatalog> catalog_;
  RecordingObserver observer_;
  std::unique_ptr<JobManager> manager_;
};

}  // namespace kiln::server::testing
