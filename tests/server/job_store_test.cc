#include "server/jobs/job_store.h"

#include <sqlite3.h>

#include <atomic>
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
        "ALTER TABLE jobs DROP COLUMN resume_checkpoint_id",
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
  job.set_resume_checkpoint_id(7);
  ASSERT_OK((*store)->PutJob(job));
  jobs = (*store)->AllJobs();
  ASSERT_OK(jobs);
  EXPECT_EQ((*jobs)[0].crash_resumes(), 2);
  EXPECT_TRUE((*jobs)[0].interrupted_by_shutdown());
  EXPECT_EQ((*jobs)[0].resume_checkpoint_id(), 7);
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
