// The store against values kilnd never writes itself: any integer in a stored row (a hostile
// worker's step number before reports were checked, a row edited by hand) is read, thinned and
// counted without overflow, and a store holding a damaged row still opens: that job FAILED with
// the reason, every other job served, by the store, the job manager and a kilnd alike.
#include <sqlite3.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/datasets/dataset_catalog.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/job_store.h"
#include "server/jobs/metric_broadcaster.h"
#include "server/jobs/proto_time.h"
#include "server_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::server {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

v1::JobEvent StepAt(int64_t seq, int64_t global_step) {
  v1::JobEvent e;
  e.set_seq(seq);
  e.mutable_step()->set_global_step(global_step);
  return e;
}

v1::JobEvent StateAt(int64_t seq, v1::JobState state) {
  v1::JobEvent e;
  e.set_seq(seq);
  e.mutable_state()->set_state(state);
  return e;
}

v1::Job MakeJob(const std::string& id, v1::JobState state) {
  v1::Job job;
  job.set_id(id);
  job.set_state(state);
  job.set_device("cpu");
  job.set_epochs(1);
  *job.mutable_create_time() = MillisToTimestamp(NowMillis());
  *job.mutable_spec() = testing::SmallSpec("toy", 1);
  return job;
}

int64_t CountSteps(JobStore& store, const std::string& job_id) {
  absl::StatusOr<std::vector<v1::JobEvent>> events =
      store.EventsPage(job_id, 0, INT64_MAX, /*include_steps=*/true, 1'000'000);
  EXPECT_OK(events);
  int64_t steps = 0;
  for (const v1::JobEvent& e : events.value_or(std::vector<v1::JobEvent>{})) steps += e.has_step();
  return steps;
}

void Sql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  const std::string message = error ? error : "";
  sqlite3_free(error);
  sqlite3_close(db);
  ASSERT_EQ(rc, SQLITE_OK) << message << " in " << sql;
}

// The thinning pass reads the step numbers it keeps by stride: the extremes of int64 must not
// overflow it (SQLite's abs(INT64_MIN) does), or every later step, and every later start, fails.
TEST(JobStoreHardeningTest, StepNumbersAtTheEndsOfInt64AreThinnedWithoutOverflow) {
  const std::string dir = testing::MakeTempDir("store-extremes");
  {
    auto store = JobStore::Open(dir + "/kiln.db", {.max_step_events_per_job = 100});
    ASSERT_OK(store);
    const v1::JobEvent queued = StateAt(1, v1::JOB_STATE_QUEUED);
    ASSERT_OK((*store)->PutJob(MakeJob("a", v1::JOB_STATE_RUNNING), &queued));
    int64_t seq = 2;
    for (int64_t step : {INT64_MIN, INT64_MAX, INT64_MIN + 1, int64_t{-1}}) {
      ASSERT_OK((*store)->AppendEvent("a", StepAt(seq++, step)));
    }
    for (int step = 1; step <= 300; ++step) {
      ASSERT_OK((*store)->AppendEvent("a", StepAt(seq++, step))) << "step " << step;
    }
    EXPECT_LE(CountSteps(**store, "a"), 100);
  }
  // Opened again with a smaller bound: thinned at open, without overflow either.
  {
    const std::string db = dir + "/kiln.db";
    for (int i = 0; i < 150; ++i) {
      ASSERT_NO_FATAL_FAILURE(Sql(
          db,
          absl::StrCat("INSERT INTO step_metrics (job_id, seq, time_ms, epoch, "
                       "step_in_epoch, steps_per_epoch, global_step, loss, lr, "
                       "samples_per_sec) VALUES ('a', ",
                       10'000 + i, ", 0, 1, 1, 1, ", i % 2 ? INT64_MIN : INT64_MAX, ", 0, 0, 0)")));
    }
  }
  auto store = JobStore::Open(dir + "/kiln.db", {.max_step_events_per_job = 100});
  ASSERT_OK(store);
  EXPECT_LE(CountSteps(**store, "a"), 100);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

int64_t CountEpochs(JobStore& store, const std::string& job_id, int* last_epoch) {
  absl::StatusOr<std::vector<v1::JobEvent>> events =
      store.EventsPage(job_id, 0, INT64_MAX, /*include_steps=*/false, 1'000'000);
  EXPECT_OK(events);
  int64_t epochs = 0;
  for (const v1::JobEvent& e : events.value_or(std::vector<v1::JobEvent>{})) {
    if (!e.has_epoch()) continue;
    ++epochs;
    *last_epoch = e.epoch().epoch();
  }
  return epochs;
}

// Epoch events were never thinned: 20,000 of them in 10 s from one worker. However they come
// (a job retried or resumed many times repeats its epochs), a job keeps at most the bound, the
// newest.
TEST(JobStoreHardeningTest, EpochHistoryStaysWithinItsBoundKeepingTheNewest) {
  const std::string dir = testing::MakeTempDir("store-epochs");
  {
    auto store = JobStore::Open(dir + "/kiln.db", {.max_epoch_events_per_job = 100});
    ASSERT_OK(store);
    const v1::JobEvent running = StateAt(1, v1::JOB_STATE_RUNNING);
    v1::Job job = MakeJob("a", v1::JOB_STATE_RUNNING);
    ASSERT_OK((*store)->PutJob(job, &running));
    for (int epoch = 1; epoch <= 250; ++epoch) {
      v1::JobEvent e;
      e.set_seq(1 + epoch);
      e.mutable_epoch()->set_epoch(epoch);
      job.set_epochs_done(epoch);
      ASSERT_OK((*store)->PutJob(job, &e));  // as JobEvents records an epoch
    }
    int last = 0;
    EXPECT_EQ(CountEpochs(**store, "a", &last), 100);
    EXPECT_EQ(last, 250);
    ASSERT_OK((*store)->AppendEvent("a", StateAt(300, v1::JOB_STATE_SUCCEEDED)));
  }
  // A store from before the bound, or opened with a lower one, is trimmed at open.
  auto store = JobStore::Open(dir + "/kiln.db", {.max_epoch_events_per_job = 10});
  ASSERT_OK(store);
  int last = 0;
  EXPECT_EQ(CountEpochs(**store, "a", &last), 10);
  EXPECT_EQ(last, 250);
  EXPECT_THAT(JobStore::Open(dir + "/other.db", {.max_epoch_events_per_job = 0}).status(),
              ::testing::Property(&absl::Status::message, HasSubstr("max_epoch_events_per_job")));
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST(JobStoreHardeningTest, KilndRefusesAnEpochBoundBelowOneNamingTheFlag) {
  const std::string root = testing::MakeTempDir("epoch-bound-flag");
  testing::KilndProcess kilnd(root + "/state", root + "/data", {"--max_epoch_events_per_job=0"});
  EXPECT_FALSE(kilnd.Start());
  EXPECT_THAT(kilnd.Stderr(), HasSubstr("--max_epoch_events_per_job: must be at least 1"));
  std::error_code ec;
  fs::remove_all(root, ec);
}

// A store as a worker's INT64_MIN step left it, and more: kilnd must start, failing that job with
// the reason, and serve the others.
class DamagedStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::MakeTempDir("damaged-store");
    fs::create_directories(root_ + "/state");
    testing::WriteToyDataset(root_ + "/data/toy", 64, 16);
    db_ = root_ + "/state/kiln.db";
    auto store = JobStore::Open(db_);
    ASSERT_OK(store);
    // A job that ended well, and one that was running when its worker sent the bad step.
    v1::JobEvent e = StateAt(1, v1::JOB_STATE_SUCCEEDED);
    v1::Job good = MakeJob("job-good", v1::JOB_STATE_SUCCEEDED);
    good.set_epochs_done(1);
    good.set_global_step(2);
    ASSERT_OK((*store)->PutJob(good, &e));
    ASSERT_OK((*store)->AppendEvent("job-good", StepAt(2, 1)));
    ASSERT_OK((*store)->AppendEvent("job-good", StepAt(3, 2)));
    e = StateAt(1, v1::JOB_STATE_RUNNING);
    v1::Job bad = MakeJob("job-bad", v1::JOB_STATE_RUNNING);
    bad.mutable_spec()->set_workers(2);
    bad.mutable_spec()->set_external_workers(true);
    ASSERT_OK((*store)->PutJob(bad, &e));
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  // Rows as the unchecked worker report and a thousand steps after it left them (over any bound
  // tried here, so that opening thins them).
  void WriteBadRows() {
    std::string sql = "BEGIN;";
    for (int i = 0; i < 1000; ++i) {
      absl::StrAppend(&sql,
                      "INSERT INTO step_metrics (job_id, seq, time_ms, epoch, step_in_epoch, "
                      "steps_per_epoch, global_step, loss, lr, samples_per_sec) VALUES "
                      "('job-bad', ",
                      2 + i, ", 0, 1, 1, 8, ", i == 0 ? INT64_MIN : int64_t{i}, ", 1, 0.1, 10);");
    }
    absl::StrAppend(&sql, "COMMIT;");
    ASSERT_NO_FATAL_FAILURE(Sql(db_, sql));
  }

  std::string root_, db_;
};

TEST_F(DamagedStoreTest, TheStoreAndTheManagerStartFailingOnlyTheDamagedJob) {
  ASSERT_NO_FATAL_FAILURE(WriteBadRows());
  auto store = JobStore::Open(db_, {.max_step_events_per_job = 100});
  ASSERT_OK(store);
  MetricBroadcaster broadcaster(16);
  DatasetCatalog catalog(root_ + "/data", int64_t{1} << 30);
  JobManagerOptions options;
  options.state_dir = root_ + "/state";
  auto manager = std::make_unique<JobManager>(store->get(), &broadcaster, &catalog, options);
  ASSERT_OK(manager->Recover());
  absl::StatusOr<v1::Job> bad = manager->Get("job-bad");
  ASSERT_OK(bad);
  EXPECT_EQ(bad->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(bad->reason(), HasSubstr("damaged"));
  EXPECT_THAT(bad->reason(), HasSubstr("global_step"));
  absl::StatusOr<v1::Job> good = manager->Get("job-good");
  ASSERT_OK(good);
  EXPECT_EQ(good->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(good->global_step(), 2);
  EXPECT_EQ(CountSteps(**store, "job-good"), 2);
  // New work is taken and runs.
  absl::StatusOr<v1::Job> fresh = manager->Submit(testing::SmallSpec("toy", 1));
  ASSERT_OK(fresh);
  EXPECT_TRUE(testing::WaitFor(
      [&] { return manager->Get(fresh->id())->state() == v1::JOB_STATE_SUCCEEDED; },
      absl::Seconds(120)))
      << manager->Get(fresh->id())->reason();
  manager.reset();
  // The failure is recorded: the next start does not find the job running.
  store->reset();
  store = JobStore::Open(db_, {.max_step_events_per_job = 100});
  ASSERT_OK(store);
  EXPECT_EQ((*store)->GetJob("job-bad")->state(), v1::JOB_STATE_FAILED);
}

TEST_F(DamagedStoreTest, KilndStartsAndServesTheOtherJobs) {
  ASSERT_NO_FATAL_FAILURE(WriteBadRows());
  testing::KilndProcess kilnd(root_ + "/state", root_ + "/data", {"--max_step_events_per_job=100"});
  ASSERT_TRUE(kilnd.Start()) << kilnd.Stderr();
  auto stub = kilnd.NewStub();
  const v1::Job bad = testing::GetJob(*stub, "job-bad");
  EXPECT_EQ(bad.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(bad.reason(), HasSubstr("damaged"));
  EXPECT_EQ(testing::GetJob(*stub, "job-good").state(), v1::JOB_STATE_SUCCEEDED);
  testing::WatchResult watch = testing::WatchToEnd(*stub, "job-bad", /*include_steps=*/true);
  EXPECT_OK(watch.status) << "the damaged job's history is still served";
  const std::string id = testing::SubmitJob(*stub, testing::SmallSpec("toy", 1));
  EXPECT_TRUE(testing::WaitForState(*stub, id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(120)));
  EXPECT_EQ(kilnd.Stop(SIGTERM, absl::Seconds(60)), 0);
}

}  // namespace
}  // namespace kiln::server
