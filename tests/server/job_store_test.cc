#include "server/jobs/job_store.h"

#include <sqlite3.h>

#include <filesystem>

#include "gtest/gtest.h"
#include "server/jobs/proto_time.h"
#include "server_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::server {
namespace {

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
  auto events = (*store)->Events("a", 100, true);
  ASSERT_OK(events);
  ASSERT_EQ(events->size(), 2u);
  EXPECT_TRUE((*events)[0].has_state());
  EXPECT_FLOAT_EQ((*events)[1].step().loss(), 2.5f);
  EXPECT_EQ((*store)->Events("a", 100, false)->size(), 1u);
  EXPECT_EQ(*(*store)->MaxSeq("a"), 2);
  EXPECT_TRUE(absl::IsNotFound((*store)->GetJob("b").status()));
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
  for (const char* sql :
       {"ALTER TABLE jobs DROP COLUMN crash_resumes",
        "ALTER TABLE jobs DROP COLUMN interrupted_by_shutdown",
        "ALTER TABLE checkpoints DROP COLUMN sha256", "UPDATE schema_version SET version = 1"}) {
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
  ASSERT_OK((*store)->PutJob(job));
  jobs = (*store)->AllJobs();
  ASSERT_OK(jobs);
  EXPECT_EQ((*jobs)[0].crash_resumes(), 2);
  EXPECT_TRUE((*jobs)[0].interrupted_by_shutdown());
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

}  // namespace
}  // namespace kiln::server
