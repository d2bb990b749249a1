#include "server/jobs/job_store.h"

#include <sqlite3.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/jobs/proto_time.h"
#include "server_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::server {
namespace {

using ::testing::HasSubstr;

v1::JobEvent StepEvent(int64_t seq, int64_t global_step) {
  v1::JobEvent e;
  e.set_seq(seq);
  e.mutable_step()->set_global_step(global_step);
  return e;
}
v1::JobEvent EpochEvent(int64_t seq, int epoch) {
  v1::JobEvent e;
  e.set_seq(seq);
  e.mutable_epoch()->set_epoch(epoch);
  return e;
}
v1::JobEvent StateEvent(int64_t seq, v1::JobState state) {
  v1::JobEvent e;
  e.set_seq(seq);
  e.mutable_state()->set_state(state);
  return e;
}

// Every event of the job up to max_seq, read in pages of `page`.
std::vector<v1::JobEvent> AllEvents(JobStore& store, const std::string& job_id, bool steps,
                                    int page = 1000, int64_t max_seq = INT64_MAX) {
  std::vector<v1::JobEvent> all;
  for (int64_t after = 0;;) {
    absl::StatusOr<std::vector<v1::JobEvent>> got =
        store.EventsPage(job_id, after, max_seq, steps, page);
    EXPECT_OK(got);
    if (!got.ok()) return all;
    EXPECT_LE(got->size(), static_cast<size_t>(page));
    for (v1::JobEvent& e : *got) {
      EXPECT_GT(e.seq(), after) << "pages in seq order, none twice";
      after = e.seq();
      all.push_back(std::move(e));
    }
    if (got->size() < static_cast<size_t>(page)) return all;
  }
}

std::vector<int64_t> StepNumbers(const std::vector<v1::JobEvent>& events) {
  std::vector<int64_t> steps;
  for (const v1::JobEvent& e : events) {
    if (e.has_step()) steps.push_back(e.step().global_step());
  }
  return steps;
}

v1::Job MakeJob(const std::string& id, v1::JobState state) {
  v1::Job job;
  job.set_id(id);
  job.set_state(state);
  job.set_device("cpu");
  job.set_epochs(3);
  *job.mutable_create_time() = MillisToTimestamp(NowMillis());
  job.mutable_spec()->set_dataset("toy");
  return job;
}

TEST(JobStoreTest, JobsAndEventsSurviveReopening) {
  const std::string dir = testing::MakeTempDir("store");
  {
    auto store = JobStore::Open(dir + "/kiln.db");
    ASSERT_OK(store) << store.status();
    v1::JobEvent state;
    state.set_seq(1);
    state.mutable_state()->set_state(v1::JOB_STATE_QUEUED);
    ASSERT_OK((*store)->PutJob(MakeJob("a", v1::JOB_STATE_QUEUED), &state));
    v1::JobEvent step;
    step.set_seq(2);
    step.mutable_step()->set_global_step(1);
    step.mutable_step()->set_loss(2.5f);
    ASSERT_OK((*store)->AppendEvent("a", step));
    v1::Job running = MakeJob("a", v1::JOB_STATE_RUNNING);
    running.set_global_step(1);
    ASSERT_OK((*store)->PutJob(running));
  }
  auto store = JobStore::Open(dir + "/kiln.db");
  ASSERT_OK(store);
  auto job = (*store)->GetJob("a");
  ASSERT_OK(job);
  EXPECT_EQ(job->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job->global_step(), 1);
  EXPECT_EQ(job->spec().dataset(), "toy");
  auto events = (*store)->EventsPage("a", 0, 100, true, 10);
  ASSERT_OK(events);
  ASSERT_EQ(events->size(), 2u);
  EXPECT_TRUE((*events)[0].has_state());
  EXPECT_FLOAT_EQ((*events)[1].step().loss(), 2.5f);
  EXPECT_EQ((*store)->EventsPage("a", 0, 100, false, 10)->size(), 1u);
  EXPECT_EQ(*(*store)->MaxSeq("a"), 2);
  EXPECT_TRUE(absl::IsNotFound((*store)->GetJob("b").status()));
  std::filesystem::remove_all(dir);
}

// A job of several workers: its retries, and each rank's samples a second beside rank 0's steps.
TEST(JobStoreTest, WorkerJobRetriesAndRankThroughputSurviveReopening) {
  const std::string dir = testing::MakeTempDir("store");
  {
    auto store = JobStore::Open(dir + "/kiln.db");
    ASSERT_OK(store);
    v1::Job job = MakeJob("a", v1::JOB_STATE_RUNNING);
    job.set_retries(2);
    ASSERT_OK((*store)->PutJob(job));
    v1::JobEvent step = StepEvent(1, 1);
    step.mutable_step()->add_rank_samples_per_sec(1500.5);
    step.mutable_step()->add_rank_samples_per_sec(1499.25);
    ASSERT_OK((*store)->AppendEvent("a", step));
    ASSERT_OK((*store)->AppendEvent("a", StepEvent(2, 2)));  // one process: none
  }
  auto store = JobStore::Open(dir + "/kiln.db");
  ASSERT_OK(store);
  EXPECT_EQ((*store)->GetJob("a")->retries(), 2);
  std::vector<v1::JobEvent> events = AllEvents(**store, "a", /*steps=*/true);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_THAT(events[0].step().rank_samples_per_sec(), ::testing::ElementsAre(1500.5, 1499.25));
  EXPECT_EQ(events[1].step().rank_samples_per_sec_size(), 0);
  std::filesystem::remove_all(dir);
}

TEST(JobStoreTest, CheckpointIndexHidesDeletedOnes) {
  const std::string dir = testing::MakeTempDir("store");
  auto store = JobStore::Open(dir + "/kiln.db");
  ASSERT_OK(store);
  ASSERT_OK((*store)->PutJob(MakeJob("a", v1::JOB_STATE_RUNNING)));
  v1::Checkpoint c1, c2;
  c1.set_job_id("a");
  c1.set_global_step(8);
  c2 = c1;
  c2.set_global_step(16);
  ASSERT_OK((*store)->InsertCheckpoint(&c1));
  ASSERT_OK((*store)->InsertCheckpoint(&c2));
  EXPECT_LT(c1.id(), c2.id());
  ASSERT_OK((*store)->DeleteCheckpoint(c1.id()));
  auto list = (*store)->Checkpoints("a");
  ASSERT_OK(list);
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].global_step(), 16);
  std::filesystem::remove_all(dir);
}

// Pages cover (after_seq, max_seq] in seq order across the four kinds of event, never more than
// the limit, with steps only when asked for.
TEST(JobStoreTest, EventsPageReadsEveryKindInSeqOrderAPageAtATime) {
  const std::string dir = testing::MakeTempDir("store");
  auto store = JobStore::Open(dir + "/kiln.db");
  ASSERT_OK(store);
  JobStore& s = **store;
  const v1::JobEvent queued = StateEvent(1, v1::JOB_STATE_QUEUED);
  ASSERT_OK(s.PutJob(MakeJob("a", v1::JOB_STATE_QUEUED), &queued));
  ASSERT_OK(s.PutJob(MakeJob("b", v1::JOB_STATE_QUEUED), &queued));  // another job's events
  ASSERT_OK(s.AppendEvent("b", StepEvent(2, 1)));
  ASSERT_OK(s.AppendEvent("a", StateEvent(2, v1::JOB_STATE_RUNNING)));
  int64_t seq = 3;
  for (int epoch = 1; epoch <= 3; ++epoch) {
    for (int step = 1; step <= 4; ++step) {
      ASSERT_OK(s.AppendEvent("a", StepEvent(seq++, (epoch - 1) * 4 + step)));
    }
    ASSERT_OK(s.AppendEvent("a", EpochEvent(seq++, epoch)));
    v1::Checkpoint c;
    c.set_job_id("a");
    c.set_global_step(epoch * 4);
    ASSERT_OK(s.InsertCheckpoint(&c));
    v1::JobEvent written;
    written.set_seq(seq++);
    *written.mutable_checkpoint() = c;
    ASSERT_OK(s.AppendEvent("a", written));
  }
  v1::Checkpoint unannounced;  // in the index, its event not yet written (seq 0)
  unannounced.set_job_id("a");
  ASSERT_OK(s.InsertCheckpoint(&unannounced));
  ASSERT_OK(s.AppendEvent("a", StateEvent(seq, v1::JOB_STATE_SUCCEEDED)));
  const int64_t last = seq;  // 2 states, 12 steps, 3 epochs, 3 checkpoints, 1 state: 21

  for (int page : {1, 2, 5, 21, 100}) {
    SCOPED_TRACE(::testing::Message() << "pages of " << page);
    std::vector<v1::JobEvent> all = AllEvents(s, "a", /*steps=*/true, page);
    ASSERT_EQ(all.size(), 21u);
    for (size_t i = 0; i < all.size(); ++i) {
      EXPECT_EQ(all[i].seq(), static_cast<int64_t>(i + 1));
      EXPECT_TRUE(all[i].replayed());
    }
    EXPECT_TRUE(all[5].has_step() && all[6].has_epoch() && all[7].has_checkpoint());
    EXPECT_EQ(all[7].checkpoint().global_step(), 4);
    EXPECT_EQ(all.back().state().state(), v1::JOB_STATE_SUCCEEDED);
    std::vector<v1::JobEvent> no_steps = AllEvents(s, "a", /*steps=*/false, page);
    EXPECT_EQ(no_steps.size(), 9u);
    EXPECT_TRUE(StepNumbers(no_steps).empty());
  }
  // A page starts after after_seq and stops at max_seq.
  auto middle = s.EventsPage("a", 7, 9, true, 10);
  ASSERT_OK(middle);
  ASSERT_EQ(middle->size(), 2u);
  EXPECT_EQ((*middle)[0].seq(), 8);
  EXPECT_EQ((*middle)[1].seq(), 9);
  auto past = s.EventsPage("a", last, INT64_MAX, true, 10);
  ASSERT_OK(past);
  EXPECT_TRUE(past->empty());
  EXPECT_EQ(AllEvents(s, "b", true).size(), 2u);
  auto bad = s.EventsPage("a", 0, last, true, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  std::filesystem::remove_all(dir);
}

// The shape of a job's steps right after a thinning pass with a bound of 100: the newest 50 whole
// (up to `newest`), each older one a multiple of a power of two (>1).
void ExpectThinnedShape(const std::vector<int64_t>& steps, int64_t newest) {
  ASSERT_GE(steps.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(steps[steps.size() - 50 + i], newest - 49 + i);
  for (size_t i = 0; i + 50 < steps.size(); ++i) {
    int64_t stride = 1;
    while (steps[i] % (stride * 2) == 0) stride *= 2;
    EXPECT_GT(stride, 1) << "step " << steps[i] << " is not on a thinned stride";
  }
}

// 1,000 steps against a bound of 100: the count never passes 100, the newest 50 stay whole, the
// older ones sit at a power-of-two stride, and no epoch or state goes. Thinning passes are
// amortised: one per quarter of the bound.
TEST(JobStoreTest, StepHistoryStaysWithinTheBoundKeepingTheNewestHalfWhole) {
  const std::string dir = testing::MakeTempDir("store");
  auto store = JobStore::Open(dir + "/kiln.db", {.max_step_events_per_job = 100});
  ASSERT_OK(store);
  JobStore& s = **store;
  const v1::JobEvent queued = StateEvent(1, v1::JOB_STATE_QUEUED);
  ASSERT_OK(s.PutJob(MakeJob("a", v1::JOB_STATE_QUEUED), &queued));
  int64_t seq = 2;
  int passes = 0;
  size_t previous = 0;
  std::vector<int64_t> steps;
  for (int step = 1; step <= 1000; ++step) {
    ASSERT_OK(s.AppendEvent("a", StepEvent(seq++, step)));
    if (step % 100 == 0) {
      ASSERT_OK(s.AppendEvent("a", EpochEvent(seq++, step / 100)));
    }
    steps = StepNumbers(AllEvents(s, "a", true));
    ASSERT_LE(steps.size(), 100u) << "after step " << step;
    if (steps.size() < previous) {
      ++passes;
      SCOPED_TRACE(::testing::Message() << "thinned after step " << step);
      ExpectThinnedShape(steps, step);
      EXPECT_GE(steps.size(), 51u) << "thinned more than needed";
      EXPECT_LE(steps.size(), 75u) << "the next pass is not a quarter of the bound away";
    }
    previous = steps.size();
  }
  ASSERT_OK(s.AppendEvent("a", StateEvent(seq, v1::JOB_STATE_SUCCEEDED)));
  EXPECT_GE(passes, 900 / 50) << "a pass at least every half bound after the first";
  EXPECT_LE(passes, 1000 / 25) << "a thinning pass more often than every quarter of the bound";
  // 950 older steps in 25 places or fewer: the oldest are at a stride of 64 at least.
  int64_t oldest_stride = 1;
  while (steps[0] % (oldest_stride * 2) == 0) oldest_stride *= 2;
  EXPECT_GE(oldest_stride, 64) << "oldest step kept: " << steps[0];
  EXPECT_EQ(steps.back(), 1000);

  int epochs = 0, states = 0;
  for (const v1::JobEvent& e : AllEvents(s, "a", true)) {
    epochs += e.has_epoch();
    states += e.has_state();
  }
  EXPECT_EQ(epochs, 10);
  EXPECT_EQ(states, 2);
  std::filesystem::remove_all(dir);
}

// A store written with a larger bound (or by a kilnd before the bound) is thinned when opened.
TEST(JobStoreTest, AStoreOverTheBoundIsThinnedWhenOpened) {
  const std::string dir = testing::MakeTempDir("store");
  {
    auto store = JobStore::Open(dir + "/kiln.db", {.max_step_events_per_job = 100'000});
    ASSERT_OK(store);
    const v1::JobEvent queued = StateEvent(1, v1::JOB_STATE_QUEUED);
    ASSERT_OK((*store)->PutJob(MakeJob("a", v1::JOB_STATE_QUEUED), &queued));
    for (int step = 1; step <= 3000; ++step) {
      ASSERT_OK((*store)->AppendEvent("a", StepEvent(1 + step, step)));
    }
    ASSERT_OK((*store)->AppendEvent("a", EpochEvent(3002, 1)));
    ASSERT_EQ(StepNumbers(AllEvents(**store, "a", true)).size(), 3000u);
  }
  auto store = JobStore::Open(dir + "/kiln.db", {.max_step_events_per_job = 200});
  ASSERT_OK(store);
  const std::vector<v1::JobEvent> all = AllEvents(**store, "a", true);
  const std::vector<int64_t> steps = StepNumbers(all);
  EXPECT_LE(steps.size(), 200u);
  ASSERT_GE(steps.size(), 100u);
  EXPECT_EQ(steps.back(), 3000);
  EXPECT_EQ(steps[steps.size() - 100], 2901);
  EXPECT_TRUE(all.back().has_epoch());
  EXPECT_TRUE(all.front().has_state());
  std::filesystem::remove_all(dir);
}

// Repeated step numbers (a job resumed after a crash repeats a few) or none at all cannot be
// thinned by stride; the bound holds anyway, dropping the oldest.
TEST(JobStoreTest, StepsWithoutDistinctNumbersStillStayWithinTheBound) {
  const std::string dir = testing::MakeTempDir("store");
  auto store = JobStore::Open(dir + "/kiln.db", {.max_step_events_per_job = 100});
  ASSERT_OK(store);
  for (int64_t seq = 1; seq <= 500; ++seq) ASSERT_OK((*store)->AppendEvent("a", StepEvent(seq, 0)));
  const std::vector<v1::JobEvent> all = AllEvents(**store, "a", true);
  EXPECT_LE(all.size(), 100u);
  EXPECT_GE(all.size(), 75u);
  EXPECT_EQ(all.back().seq(), 500);
  std::filesystem::remove_all(dir);
}

TEST(JobStoreTest, ABoundBelowTheMinimumIsRefusedNamingIt) {
  const std::string dir = testing::MakeTempDir("store");
  auto store = JobStore::Open(dir + "/kiln.db", {.max_step_events_per_job = 99});
  ASSERT_TRUE(absl::IsInvalidArgument(store.status())) << store.status();
  EXPECT_THAT(std::string(store.status().message()),
              HasSubstr("max_step_events_per_job must be at least 100, got 99"));
  std::filesystem::remove_all(dir);
}

// A store written by the kilnd of schema 1 opens with its jobs, and keeps the new fields.
TEST(JobStoreTest, AVersionOneStoreIsMigratedKeepingItsJobs) {
  const std::string dir = testing::MakeTempDir("store");
  v1::Job job;
  job.set_id("a");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_device("cpu");
  job.set_epochs(3);
  {
    auto store = JobStore::Open(dir + "/kiln.db");
    ASSERT_OK(store);
    ASSERT_OK((*store)->PutJob(job));
  }
  // Back to what version 1 wrote.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir + "/kiln.db").c_str(), &db), SQLITE_OK);
  for (const char* sql : {"ALTER TABLE jobs DROP COLUMN crash_resumes",
                          "ALTER TABLE jobs DROP COLUMN interrupted_by_shutdown",
                          "ALTER TABLE jobs DROP COLUMN resume_checkpoint_id",
                          "ALTER TABLE checkpoints DROP COLUMN sha256", "DROP TABLE deployments",
                          "ALTER TABLE jobs DROP COLUMN retries",
                          "ALTER TABLE step_metrics DROP COLUMN rank_samples_per_sec",
                          "DROP INDEX jobs_by_team", "ALTER TABLE jobs DROP COLUMN owner_user",
                          "ALTER TABLE jobs DROP COLUMN owner_team",
                          "UPDATE schema_version SET version = 1"}) {
    ASSERT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK) << sql;
  }
  sqlite3_close(db);
  auto store = JobStore::Open(dir + "/kiln.db");
  ASSERT_OK(store);
  auto jobs = (*store)->AllJobs();
  ASSERT_OK(jobs);
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].epochs(), 3);
  EXPECT_EQ((*jobs)[0].crash_resumes(), 0);
  job.set_crash_resumes(2);
  job.set_interrupted_by_shutdown(true);
  job.set_resume_checkpoint_id(7);
  job.set_retries(1);
  ASSERT_OK((*store)->PutJob(job));
  jobs = (*store)->AllJobs();
  ASSERT_OK(jobs);
  EXPECT_EQ((*jobs)[0].retries(), 1);
  EXPECT_EQ((*jobs)[0].crash_resumes(), 2);
  EXPECT_TRUE((*jobs)[0].interrupted_by_shutdown());
  EXPECT_EQ((*jobs)[0].resume_checkpoint_id(), 7);
  // The deployments table is made, with its later columns.
  ASSERT_OK((*store)->SetModelDeployments("m", {{"m", "1", "load m1"}}));
  ASSERT_OK((*store)->MarkDeploymentRestoring("m", "1"));
  auto deployments = (*store)->Deployments();
  ASSERT_OK(deployments);
  ASSERT_EQ(deployments->size(), 1u);
  EXPECT_TRUE((*deployments)[0].restoring);
  std::filesystem::remove_all(dir);
}

// Deployments are kept per model as a whole list (what is loaded now, in load order), so an
// unload, a replaced version and an evicted one all come down to writing the model's list again.
TEST(JobStoreTest, DeploymentsAreReplacedPerModelAndListedInTheOrderTheyWereWritten) {
  const std::string dir = testing::MakeTempDir("store");
  {
    auto store = JobStore::Open(dir + "/kiln.db");
    ASSERT_OK(store);
    ASSERT_OK((*store)->SetModelDeployments("a", {{"a", "1", "load a1"}, {"a", "2", "load a2"}}));
    ASSERT_OK((*store)->SetModelDeployments("b", {{"b", "7", "load b7"}}));
    ASSERT_OK((*store)->SetModelDeployments("a", {{"a", "2", "load a2"}, {"a", "3", "load a3"}}));
    ASSERT_OK((*store)->SetModelDeployments("c", {{"c", "1", std::string("\0bytes\xff", 7)}}));
    ASSERT_OK((*store)->SetModelDeployments("c", {}));
  }
  auto store = JobStore::Open(dir + "/kiln.db");  // what a restarted kilnd reads
  ASSERT_OK(store);
  auto all = (*store)->Deployments();
  ASSERT_OK(all);
  std::vector<std::string> seen;
  for (const StoredDeployment& d : *all) {
    seen.push_back(absl::StrCat(d.model, "/", d.version, "=", d.load_request));
  }
  EXPECT_THAT(seen, ::testing::ElementsAre("b/7=load b7", "a/2=load a2", "a/3=load a3"));
  // Bytes come back as they went in.
  ASSERT_OK((*store)->SetModelDeployments("c", {{"c", "1", std::string("\0bytes\xff", 7)}}));
  all = (*store)->Deployments();
  ASSERT_OK(all);
  EXPECT_EQ(all->back().load_request, std::string("\0bytes\xff", 7));
  std::filesystem::remove_all(dir);
}

// A deployment is marked while kilnd loads it at start; a mark that survives to the next open
// says that start died loading it. Writing the model's deployments again clears it.
TEST(JobStoreTest, ADeploymentMarkedRestoringStaysMarkedUntilClearedOrRewritten) {
  const std::string dir = testing::MakeTempDir("store");
  {
    auto store = JobStore::Open(dir + "/kiln.db");
    ASSERT_OK(store);
    ASSERT_OK((*store)->SetModelDeployments("a", {{"a", "1", "load a1"}, {"a", "2", "load a2"}}));
    ASSERT_OK((*store)->SetModelDeployments("b", {{"b", "7", "load b7"}}));
    ASSERT_OK((*store)->MarkDeploymentRestoring("a", "1"));
    ASSERT_OK((*store)->ClearDeploymentRestoring("a", "1"));
    ASSERT_OK((*store)->MarkDeploymentRestoring("a", "2"));  // and then kilnd is killed
    ASSERT_OK((*store)->MarkDeploymentRestoring("b", "7"));
    absl::Status none = (*store)->MarkDeploymentRestoring("a", "3");
    EXPECT_TRUE(absl::IsNotFound(none)) << none;
    EXPECT_THAT(std::string(none.message()), HasSubstr("model \"a\" version \"3\""));
  }
  auto store = JobStore::Open(dir + "/kiln.db");
  ASSERT_OK(store);
  auto marked = [&] {
    std::vector<std::string> out;
    auto all = (*store)->Deployments();
    EXPECT_OK(all);
    if (!all.ok()) return out;
    for (const StoredDeployment& d : *all) {
      out.push_back(absl::StrCat(d.model, "/", d.version, d.restoring ? " restoring" : ""));
    }
    return out;
  };
  EXPECT_THAT(marked(), ::testing::ElementsAre("a/1", "a/2 restoring", "b/7 restoring"));
  // A model's deployments written anew (a load or unload by hand) come unmarked.
  ASSERT_OK((*store)->SetModelDeployments("a", {{"a", "2", "load a2"}}));
  EXPECT_THAT(marked(), ::testing::ElementsAre("b/7 restoring", "a/2"));
  std::filesystem::remove_all(dir);
}

TEST(JobStoreTest, NewerSchemaIsRefused) {
  const std::string dir = testing::MakeTempDir("store");
  { ASSERT_OK(JobStore::Open(dir + "/kiln.db")); }
  // A future kilnd wrote version 99.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir + "/kiln.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE schema_version SET version = 99", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  auto store = JobStore::Open(dir + "/kiln.db");
  EXPECT_TRUE(absl::IsFailedPrecondition(store.status())) << store.status();
  std::filesystem::remove_all(dir);
}

// A VFS over the default one that counts fsyncs of write-ahead-log files: what makes a commit
// survive a power failure in WAL mode.
struct CountingVfs {
  static inline sqlite3_vfs* base = nullptr;
  static inline sqlite3_vfs vfs{};
  static inline sqlite3_io_methods methods{};
  static inline const sqlite3_io_methods* base_methods = nullptr;
  static inline std::atomic<int> wal_syncs{0};

  struct File {
    sqlite3_file base_file;  // must come first: SQLite sees this
    bool is_wal;
    sqlite3_file* real;  // the default VFS's file, allocated right after this struct
  };

  static int Sync(sqlite3_file* f, int flags) {
    File* file = reinterpret_cast<File*>(f);
    if (file->is_wal) ++wal_syncs;
    return file->real->pMethods->xSync(file->real, flags);
  }
  static int Open(sqlite3_vfs*, const char* name, sqlite3_file* f, int flags, int* out_flags) {
    File* file = reinterpret_cast<File*>(f);
    file->real = reinterpret_cast<sqlite3_file*>(file + 1);
    file->is_wal = (flags & SQLITE_OPEN_WAL) != 0;
    const int rc = base->xOpen(base, name, file->real, flags, out_flags);
    if (rc != SQLITE_OK || file->real->pMethods == nullptr) {
      f->pMethods = nullptr;
      return rc;
    }
    if (base_methods == nullptr) base_methods = file->real->pMethods;
    // Every other method forwards to the real file.
    methods = *file->real->pMethods;
    methods.xClose = [](sqlite3_file* f) {
      sqlite3_file* real = reinterpret_cast<File*>(f)->real;
      return real->pMethods->xClose(real);
    };
#define KILN_FORWARD(name, ...)                            \
  [](sqlite3_file* f, auto... args) {                      \
    sqlite3_file* real = reinterpret_cast<File*>(f)->real; \
    return real->pMethods->name(real, args...);            \
  }
    methods.xRead = KILN_FORWARD(xRead);
    methods.xWrite = KILN_FORWARD(xWrite);
    methods.xTruncate = KILN_FORWARD(xTruncate);
    methods.xSync = Sync;
    methods.xFileSize = KILN_FORWARD(xFileSize);
    methods.xLock = KILN_FORWARD(xLock);
    methods.xUnlock = KILN_FORWARD(xUnlock);
    methods.xCheckReservedLock = KILN_FORWARD(xCheckReservedLock);
    methods.xFileControl = KILN_FORWARD(xFileControl);
    methods.xSectorSize = KILN_FORWARD(xSectorSize);
    methods.xDeviceCharacteristics = KILN_FORWARD(xDeviceCharacteristics);
    methods.xShmMap = KILN_FORWARD(xShmMap);
    methods.xShmLock = KILN_FORWARD(xShmLock);
    methods.xShmBarrier = KILN_FORWARD(xShmBarrier);
    methods.xShmUnmap = KILN_FORWARD(xShmUnmap);
    methods.xFetch = KILN_FORWARD(xFetch);
    methods.xUnfetch = KILN_FORWARD(xUnfetch);
#undef KILN_FORWARD
    f->pMethods = &methods;
    return SQLITE_OK;
  }
  // Makes it the default VFS, so JobStore::Open uses it.
  static void Install() {
    if (base != nullptr) return;
    base = sqlite3_vfs_find(nullptr);
    vfs = *base;
    vfs.zName = "kiln-counting";
    vfs.szOsFile = static_cast<int>(sizeof(File)) + base->szOsFile;
    vfs.xOpen = Open;
    sqlite3_vfs_register(&vfs, /*makeDflt=*/1);
  }
  static void Uninstall() {
    if (base == nullptr) return;
    sqlite3_vfs_unregister(&vfs);
    sqlite3_vfs_register(base, 1);
    base = nullptr;
  }
};

// A state change is announced to clients once it is committed, so its commit must survive a
// power failure (the write-ahead log synced); a step's metrics need not (synchronous=NORMAL).
TEST(JobStoreTest, AnnouncedChangesAreSyncedToDiskButStepMetricsAreNot) {
  CountingVfs::Install();
  const std::string dir = testing::MakeTempDir("store");
  {
    auto store = JobStore::Open(dir + "/kiln.db");
    ASSERT_OK(store);
    v1::Job job = MakeJob("a", v1::JOB_STATE_QUEUED);
    v1::JobEvent step;
    step.set_seq(1);
    step.mutable_step()->set_global_step(1);
    int before = CountingVfs::wal_syncs;
    ASSERT_OK((*store)->AppendEvent("a", step));
    EXPECT_EQ(CountingVfs::wal_syncs, before) << "a step's metrics are not synced";
    before = CountingVfs::wal_syncs;
    ASSERT_OK((*store)->PutJob(job));
    EXPECT_GT(CountingVfs::wal_syncs, before) << "a state change is synced before it is announced";
    v1::Checkpoint c;
    c.set_job_id("a");
    c.set_path("/x");
    before = CountingVfs::wal_syncs;
    ASSERT_OK((*store)->InsertCheckpoint(&c));
    EXPECT_GT(CountingVfs::wal_syncs, before) << "a checkpoint's record is synced";
    step.set_seq(2);
    before = CountingVfs::wal_syncs;
    ASSERT_OK((*store)->AppendEvent("a", step));
    EXPECT_EQ(CountingVfs::wal_syncs, before) << "and steps are back to NORMAL after";
  }
  CountingVfs::Uninstall();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln::server
