#include "server/jobs/job_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "server/jobs/proto_time.h"

namespace kiln::server {
namespace {

// Version 1. Metrics get typed columns so the database can be queried with the sqlite3 shell;
// the spec and the last epoch's metrics are stored as serialized protos.
constexpr const char* kSchemaV1 = R"sql(
CREATE TABLE IF NOT EXISTS jobs (
  rowid INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  state INTEGER NOT NULL,
  reason TEXT NOT NULL DEFAULT '',
  device TEXT NOT NULL,
  create_ms INTEGER NOT NULL,
  start_ms INTEGER NOT NULL DEFAULT 0,
  end_ms INTEGER NOT NULL DEFAULT 0,
  epochs INTEGER NOT NULL,
  epochs_done INTEGER NOT NULL DEFAULT 0,
  global_step INTEGER NOT NULL DEFAULT 0,
  best_test_accuracy REAL NOT NULL DEFAULT 0,
  attempts INTEGER NOT NULL DEFAULT 0,
  resumed_from_step INTEGER NOT NULL DEFAULT 0,
  parameter_count INTEGER NOT NULL DEFAULT 0,
  last_epoch BLOB
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state, rowid);
CREATE TABLE IF NOT EXISTS specs (
  job_id TEXT PRIMARY KEY REFERENCES jobs(id),
  spec BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS state_changes (
  job_id TEXT NOT NULL, seq INTEGER NOT NULL, time_ms INTEGER NOT NULL,
  state INTEGER NOT NULL, reason TEXT NOT NULL,
  PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS step_metrics (
  job_id TEXT NOT NULL, seq INTEGER NOT NULL, time_ms INTEGER NOT NULL,
  epoch INTEGER NOT NULL, step_in_epoch INTEGER NOT NULL, steps_per_epoch INTEGER NOT NULL,
  global_step INTEGER NOT NULL, loss REAL NOT NULL, lr REAL NOT NULL,
  samples_per_sec REAL NOT NULL,
  PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS epoch_metrics (
  job_id TEXT NOT NULL, seq INTEGER NOT NULL, time_ms INTEGER NOT NULL,
  epoch INTEGER NOT NULL, train_loss REAL NOT NULL, train_accuracy REAL NOT NULL,
  test_loss REAL NOT NULL, test_accuracy REAL NOT NULL, test_samples INTEGER NOT NULL,
  train_seconds REAL NOT NULL, samples_per_sec REAL NOT NULL, lr REAL NOT NULL,
  PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoints (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  job_id TEXT NOT NULL, seq INTEGER NOT NULL, kind INTEGER NOT NULL,
  epochs_done INTEGER NOT NULL, global_step INTEGER NOT NULL, test_accuracy REAL NOT NULL,
  size_bytes INTEGER NOT NULL, create_ms INTEGER NOT NULL, path TEXT NOT NULL,
  deleted INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS checkpoints_by_job ON checkpoints(job_id, id);
)sql";

// A full disk or a failing one is UNAVAILABLE (kilnd degrades and retries; the client may retry
// later); anything else is a bug or a damaged database.
absl::StatusCode CodeOf(int sqlite_code) {
  switch (sqlite_code & 0xff) {
    case SQLITE_FULL:
    case SQLITE_IOERR:
    case SQLITE_READONLY:
    case SQLITE_CANTOPEN:
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status SqliteError(sqlite3* db, absl::string_view what) {
  const int code = sqlite3_extended_errcode(db);
  const char* hint = (code & 0xff) == SQLITE_FULL ? " (the disk holding --state_dir is full)" : "";
  return absl::Status(CodeOf(code),
                      absl::StrCat("job store: ", what, ": ", sqlite3_errmsg(db), hint));
}

// A prepared statement with typed binds by position (1-based) and columns (0-based).
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) : db_(db) {
    if (sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr) != SQLITE_OK) stmt_ = nullptr;
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  absl::Status status() const { return stmt_ ? absl::OkStatus() : SqliteError(db_, "prepare"); }
  void Bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  void Bind(int i, int v) { sqlite3_bind_int64(stmt_, i, v); }
  void Bind(int i, double v) { sqlite3_bind_double(stmt_, i, v); }
  void Bind(int i, absl::string_view v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  void BindBlob(int i, const std::string& v) {
    sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  }
  // True while rows come; false at the end. Errors go to *status.
  bool Step(absl::Status* status) {
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc != SQLITE_DONE) *status = SqliteError(db_, "step");
    return false;
  }
  absl::Status Run() {
    absl::Status status;
    while (Step(&status)) {
    }
    return status;
  }
  int64_t Int(int c) const { return sqlite3_column_int64(stmt_, c); }
  int Type(int c) const { return sqlite3_column_type(stmt_, c); }
  double Real(int c) const { return sqlite3_column_double(stmt_, c); }
  std::string Text(int c) const {
    const unsigned char* p = sqlite3_column_text(stmt_, c);
    return p ? std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(stmt_, c))
             : std::string();
  }
  std::string Blob(int c) const {
    const void* p = sqlite3_column_blob(stmt_, c);
    return p ? std::string(static_cast<const char*>(p), sqlite3_column_bytes(stmt_, c))
             : std::string();
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
};

// Version 2: what the restart after a crash needs to know (Job.crash_resumes,
// Job.interrupted_by_shutdown).
constexpr const char* kSchemaV2 = R"sql(
ALTER TABLE jobs ADD COLUMN crash_resumes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN interrupted_by_shutdown INTEGER NOT NULL DEFAULT 0;
)sql";

// Version 3: each checkpoint's SHA-256 as written (Checkpoint.sha256).
constexpr const char* kSchemaV3 = R"sql(
ALTER TABLE checkpoints ADD COLUMN sha256 TEXT NOT NULL DEFAULT '';
)sql";

// Version 4: checkpoint events are read by seq, a page at a time (EventsPage). The event tables
// are keyed by (job_id, seq) already.
constexpr const char* kSchemaV4 = R"sql(
CREATE INDEX IF NOT EXISTS checkpoints_by_job_seq ON checkpoints(job_id, seq);
)sql";

// Version 5: the checkpoint a resumed job is to start from (Job.resume_checkpoint_id).
constexpr const char* kSchemaV5 = R"sql(
ALTER TABLE jobs ADD COLUMN resume_checkpoint_id INTEGER NOT NULL DEFAULT 0;
)sql";

// Version 6: the deployed models, restored when kilnd starts (SetModelDeployments).
constexpr const char* kSchemaV6 = R"sql(
CREATE TABLE IF NOT EXISTS deployments (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  model TEXT NOT NULL,
  version TEXT NOT NULL,
  load_request BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS deployments_by_model ON deployments(model);
)sql";

// Version 7: jobs of several workers: their retries (Job.retries), and each rank's samples a
// second beside a step (StepMetrics.rank_samples_per_sec, packed doubles; NULL for one process).
constexpr const char* kSchemaV7 = R"sql(
ALTER TABLE jobs ADD COLUMN retries INTEGER NOT NULL DEFAULT 0;
ALTER TABLE step_metrics ADD COLUMN rank_samples_per_sec BLOB;
)sql";

// Version 8: a deployment being loaded at start (StoredDeployment.restoring): still marked at the
// next start, the one before died loading it, and it is not loaded again.
constexpr const char* kSchemaV8 = R"sql(
ALTER TABLE deployments ADD COLUMN restoring INTEGER NOT NULL DEFAULT 0;
)sql";

// Version 9: who submitted each job and for which team (Job.owner); empty for older jobs.
constexpr const char* kSchemaV9 = R"sql(
ALTER TABLE jobs ADD COLUMN owner_user TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN owner_team TEXT NOT NULL DEFAULT '';
CREATE INDEX IF NOT EXISTS jobs_by_team ON jobs(owner_team, rowid);
)sql";

// Doubles as little-endian bytes (the machines kilnd runs on), and back.
std::string PackDoubles(const google::protobuf::RepeatedField<double>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(double));
}
void UnpackDoubles(const std::string& bytes, google::protobuf::RepeatedField<double>* values) {
  const size_t n = bytes.size() / sizeof(double);
  values->Resize(static_cast<int>(n), 0);
  if (n > 0) std::memcpy(values->mutable_data(), bytes.data(), n * sizeof(double));
}

constexpr const char* kJobColumns =
    "j.rowid, j.id, j.state, j.reason, j.device, j.create_ms, j.start_ms, j.end_ms, j.epochs, "
    "j.epochs_done, j.global_step, j.best_test_accuracy, j.attempts, j.resumed_from_step, "
    "j.parameter_count, j.last_epoch, s.spec, j.crash_resumes, j.interrupted_by_shutdown, "
    "j.resume_checkpoint_id, j.retries, j.owner_user, j.owner_team";

v1::Job JobFromRow(const Statement& s) {
  v1::Job job;
  job.set_id(s.Text(1));
  job.set_state(static_cast<v1::JobState>(s.Int(2)));
  job.set_reason(s.Text(3));
  job.set_device(s.Text(4));
  *job.mutable_create_time() = MillisToTimestamp(s.Int(5));
  if (s.Int(6) != 0) *job.mutable_start_time() = MillisToTimestamp(s.Int(6));
  if (s.Int(7) != 0) *job.mutable_end_time() = MillisToTimestamp(s.Int(7));
  job.set_epochs(static_cast<int32_t>(s.Int(8)));
  job.set_epochs_done(static_cast<int32_t>(s.Int(9)));
  job.set_global_step(s.Int(10));
  job.set_best_test_accuracy(s.Real(11));
  job.set_attempts(static_cast<int32_t>(s.Int(12)));
  job.set_resumed_from_step(s.Int(13));
  job.set_parameter_count(s.Int(14));
  std::string last_epoch = s.Blob(15);
  if (!last_epoch.empty()) job.mutable_last_epoch()->ParseFromString(last_epoch);
  job.mutable_spec()->ParseFromString(s.Blob(16));
  job.set_crash_resumes(static_cast<int32_t>(s.Int(17)));
  job.set_interrupted_by_shutdown(s.Int(18) != 0);
  job.set_resume_checkpoint_id(s.Int(19));
  job.set_retries(static_cast<int32_t>(s.Int(20)));
  if (!s.Text(21).empty() || !s.Text(22).empty()) {
    job.mutable_owner()->set_user(s.Text(21));
    job.mutable_owner()->set_team(s.Text(22));
  }
  return job;
}

v1::Checkpoint CheckpointFromRow(const Statement& s) {
  v1::Checkpoint c;
  c.set_id(s.Int(0));
  c.set_job_id(s.Text(1));
  c.set_kind(static_cast<v1::CheckpointKind>(s.Int(3)));
  c.set_epochs_done(static_cast<int32_t>(s.Int(4)));
  c.set_global_step(s.Int(5));
  c.set_test_accuracy(s.Real(6));
  c.set_size_bytes(s.Int(7));
  *c.mutable_create_time() = MillisToTimestamp(s.Int(8));
  c.set_path(s.Text(9));
  c.set_sha256(s.Text(10));
  return c;
}

constexpr const char* kCheckpointColumns =
    "id, job_id, seq, kind, epochs_done, global_step, test_accuracy, size_bytes, create_ms, path, "
    "sha256";

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path,
                                                         JobStoreOptions options) {
  if (options.max_step_events_per_job < kMinStepEventsPerJob) {
    return absl::InvalidArgumentError(
        absl::StrCat("job store: max_step_events_per_job must be at least ", kMinStepEventsPerJob,
                     ", got ", options.max_step_events_per_job));
  }
  if (options.max_epoch_events_per_job < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("job store: max_epoch_events_per_job must be at least 1, got ",
                     options.max_epoch_events_per_job));
  }
  sqlite3* db = nullptr;
  int rc =
      sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    absl::Status status = absl::UnavailableError(
        absl::StrCat("job store: cannot open ", path, ": ", db ? sqlite3_errmsg(db) : "no memory"));
    sqlite3_close(db);
    return status;
  }
  std::unique_ptr<JobStore> store(new JobStore(db, options));
  sqlite3_busy_timeout(db, 5000);
  // WAL lets readers proceed during writes; NORMAL sync is durable across process crashes
  // (only a power loss can drop the last transactions), which is what a daemon's SIGKILL needs.
  KILN_RETURN_IF_ERROR(store->Exec("PRAGMA journal_mode=WAL"));
  KILN_RETURN_IF_ERROR(store->Exec("PRAGMA synchronous=NORMAL"));
  KILN_RETURN_IF_ERROR(store->Exec("PRAGMA foreign_keys=ON"));
  KILN_RETURN_IF_ERROR(store->Migrate());
  KILN_RETURN_IF_ERROR(store->CheckAndThinAllJobs());
  return store;
}

JobStore::~JobStore() { sqlite3_close(db_); }

absl::Status JobStore::Exec(const char* sql) {
  char* error = nullptr;
  if (const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &error); rc != SQLITE_OK) {
    const char* hint = (rc & 0xff) == SQLITE_FULL ? " (the disk holding --state_dir is full)" : "";
    absl::Status status = absl::Status(
        CodeOf(rc),
        absl::StrCat("job store: ", error ? error : "unknown error", hint, " in: ", sql));
    sqlite3_free(error);
    return status;
  }
  return absl::OkStatus();
}

absl::Status JobStore::Migrate() {
  std::lock_guard<std::mutex> lock(mu_);
  KILN_RETURN_IF_ERROR(Exec("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER)"));
  int64_t version = 0;
  {
    Statement s(db_, "SELECT version FROM schema_version");
    KILN_RETURN_IF_ERROR(s.status());
    absl::Status status;
    if (s.Step(&status)) version = s.Int(0);
    KILN_RETURN_IF_ERROR(status);
  }
  if (version > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat("job store: schema version ", version,
                                                      " is newer than this kilnd's (",
                                                      kSchemaVersion, "); upgrade kilnd"));
  }
  if (version == kSchemaVersion) return absl::OkStatus();
  // Each later version adds one step here, applied in order inside the same transaction.
  KILN_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  absl::Status status;
  if (version < 1) status = Exec(kSchemaV1);
  if (status.ok() && version < 2) status = Exec(kSchemaV2);
  if (status.ok() && version < 3) status = Exec(kSchemaV3);
  if (status.ok() && version < 4) status = Exec(kSchemaV4);
  if (status.ok() && version < 5) status = Exec(kSchemaV5);
  if (status.ok() && version < 6) status = Exec(kSchemaV6);
  if (status.ok() && version < 7) status = Exec(kSchemaV7);
  if (status.ok() && version < 8) status = Exec(kSchemaV8);
  if (status.ok() && version < 9) status = Exec(kSchemaV9);
  if (status.ok()) status = Exec("DELETE FROM schema_version");
  if (status.ok()) {
    status = Exec(absl::StrCat("INSERT INTO schema_version VALUES (", kSchemaVersion, ")").c_str());
  }
  if (!status.ok()) {
    Exec("ROLLBACK").IgnoreError();
    return status;
  }
  return Exec("COMMIT");
}

JobStore::SyncedCommits::SyncedCommits(JobStore* store) : store_(store) {
  store_->Exec("PRAGMA synchronous=FULL").IgnoreError();
}

JobStore::SyncedCommits::~SyncedCommits() {
  store_->Exec("PRAGMA synchronous=NORMAL").IgnoreError();
}

absl::Status JobStore::PutJobLocked(const v1::Job& job) {
  Statement s(db_,
              "INSERT INTO jobs (id, state, reason, device, create_ms, start_ms, end_ms, epochs, "
              "epochs_done, global_step, best_test_accuracy, attempts, resumed_from_step, "
              "parameter_count, last_epoch, crash_resumes, interrupted_by_shutdown, "
              "resume_checkpoint_id, retries, owner_user, owner_team) VALUES (?1, ?2, ?3, ?4, ?5, "
              "?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21) "
              "ON CONFLICT(id) DO UPDATE SET state = ?2, reason = ?3, device = ?4, start_ms = ?6, "
              "end_ms = ?7, epochs = ?8, epochs_done = ?9, global_step = ?10, "
              "best_test_accuracy = ?11, attempts = ?12, resumed_from_step = ?13, "
              "parameter_count = ?14, last_epoch = ?15, crash_resumes = ?16, "
              "interrupted_by_shutdown = ?17, resume_checkpoint_id = ?18, retries = ?19");
  KILN_RETURN_IF_ERROR(s.status());
  s.Bind(1, job.id());
  s.Bind(2, static_cast<int>(job.state()));
  s.Bind(3, job.reason());
  s.Bind(4, job.device());
  s.Bind(5, TimestampToMillis(job.create_time()));
  s.Bind(6, job.has_start_time() ? TimestampToMillis(job.start_time()) : int64_t{0});
  s.Bind(7, job.has_end_time() ? TimestampToMillis(job.end_time()) : int64_t{0});
  s.Bind(8, job.epochs());
  s.Bind(9, job.epochs_done());
  s.Bind(10, job.global_step());
  s.Bind(11, job.best_test_accuracy());
  s.Bind(12, job.attempts());
  s.Bind(13, job.resumed_from_step());
  s.Bind(14, job.parameter_count());
  s.BindBlob(15, job.has_last_epoch() ? job.last_epoch().SerializeAsString() : std::string());
  s.Bind(16, job.crash_resumes());
  s.Bind(17, job.interrupted_by_shutdown() ? 1 : 0);
  s.Bind(18, job.resume_checkpoint_id());
  s.Bind(19, job.retries());
  s.Bind(20, job.owner().user());  // the owner never changes: not in the UPDATE
  s.Bind(21, job.owner().team());
  KILN_RETURN_IF_ERROR(s.Run());
  Statement spec(db_, "INSERT OR IGNORE INTO specs (job_id, spec) VALUES (?1, ?2)");
  KILN_RETURN_IF_ERROR(spec.status());
  spec.Bind(1, job.id());
  spec.BindBlob(2, job.spec().SerializeAsString());
  return spec.Run();
}

absl::Status JobStore::AppendEventLocked(const std::string& job_id, const v1::JobEvent& e) {
  int64_t time_ms = TimestampToMillis(e.time());
  switch (e.event_case()) {
    case v1::JobEvent::kState: {
      Statement s(db_,
                  "INSERT INTO state_changes (job_id, seq, time_ms, state, reason) "
                  "VALUES (?, ?, ?, ?, ?)");
      KILN_RETURN_IF_ERROR(s.status());
      s.Bind(1, job_id);
      s.Bind(2, e.seq());
      s.Bind(3, time_ms);
      s.Bind(4, static_cast<int>(e.state().state()));
      s.Bind(5, e.state().reason());
      return s.Run();
    }
    case v1::JobEvent::kStep: {
      const v1::StepMetrics& m = e.step();
      Statement s(db_,
                  "INSERT INTO step_metrics (job_id, seq, time_ms, epoch, step_in_epoch, "
                  "steps_per_epoch, global_step, loss, lr, samples_per_sec, "
                  "rank_samples_per_sec) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
      KILN_RETURN_IF_ERROR(s.status());
      s.Bind(1, job_id);
      s.Bind(2, e.seq());
      s.Bind(3, time_ms);
      s.Bind(4, m.epoch());
      s.Bind(5, m.step_in_epoch());
      s.Bind(6, m.steps_per_epoch());
      s.Bind(7, m.global_step());
      s.Bind(8, static_cast<double>(m.loss()));
      s.Bind(9, static_cast<double>(m.lr()));
      s.Bind(10, m.samples_per_sec());
      if (m.rank_samples_per_sec_size() > 0) s.BindBlob(11, PackDoubles(m.rank_samples_per_sec()));
      KILN_RETURN_IF_ERROR(s.Run());
      return StepAppendedLocked(job_id);
    }
    case v1::JobEvent::kEpoch: {
      const v1::EpochMetrics& m = e.epoch();
      Statement s(db_,
                  "INSERT INTO epoch_metrics (job_id, seq, time_ms, epoch, train_loss, "
                  "train_accuracy, test_loss, test_accuracy, test_samples, train_seconds, "
                  "samples_per_sec, lr) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
      KILN_RETURN_IF_ERROR(s.status());
      s.Bind(1, job_id);
      s.Bind(2, e.seq());
      s.Bind(3, time_ms);
      s.Bind(4, m.epoch());
      s.Bind(5, m.train_loss());
      s.Bind(6, m.train_accuracy());
      s.Bind(7, m.test_loss());
      s.Bind(8, m.test_accuracy());
      s.Bind(9, m.test_samples());
      s.Bind(10, m.train_seconds());
      s.Bind(11, m.samples_per_sec());
      s.Bind(12, static_cast<double>(m.lr()));
      KILN_RETURN_IF_ERROR(s.Run());
      return EpochAppendedLocked(job_id);
    }
    case v1::JobEvent::kCheckpoint: {
      // The checkpoint row itself is the record; it carries the event's seq.
      Statement s(db_, "UPDATE checkpoints SET seq = ? WHERE id = ?");
      KILN_RETURN_IF_ERROR(s.status());
      s.Bind(1, e.seq());
      s.Bind(2, e.checkpoint().id());
      return s.Run();
    }
    case v1::JobEvent::EVENT_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("job store: event without content");
}

absl::Status JobStore::PutJob(const v1::Job& job, const v1::JobEvent* event) {
  std::lock_guard<std::mutex> lock(mu_);
  const SyncedCommits synced(this);
  KILN_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  absl::Status status = PutJobLocked(job);
  if (status.ok() && event != nullptr) status = AppendEventLocked(job.id(), *event);
  if (status.ok()) status = Exec("COMMIT");
  if (!status.ok()) {
    Exec("ROLLBACK").IgnoreError();
    // A step or an epoch may have been counted; count again next time.
    step_counts_.erase(job.id());
    epoch_counts_.erase(job.id());
  }
  return status;
}

absl::Status JobStore::AppendEvent(const std::string& job_id, const v1::JobEvent& event) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status status = AppendEventLocked(job_id, event);
  if (!status.ok()) {
    step_counts_.erase(job_id);
    epoch_counts_.erase(job_id);
  }
  return status;
}

absl::StatusOr<int64_t*> JobStore::CountAppendedLocked(std::map<std::string, int64_t>& counts,
                                                       const char* table,
                                                       const std::string& job_id) {
  auto it = counts.find(job_id);
  if (it != counts.end()) {
    ++it->second;
    return &it->second;
  }
  // Not cached yet: the row just appended is in the count.
  Statement s(db_, absl::StrCat("SELECT COUNT(*) FROM ", table, " WHERE job_id = ?").c_str());
  KILN_RETURN_IF_ERROR(s.status());
  s.Bind(1, job_id);
  absl::Status status;
  const int64_t count = s.Step(&status) ? s.Int(0) : 0;
  KILN_RETURN_IF_ERROR(status);
  return &counts.emplace(job_id, count).first->second;
}

absl::Status JobStore::StepAppendedLocked(const std::string& job_id) {
  KILN_ASSIGN_OR_RETURN(int64_t * count, CountAppendedLocked(step_counts_, "step_metrics", job_id));
  if (*count <= options_.max_step_events_per_job) return absl::OkStatus();
  // Its own transaction unless the step came inside one (PutJob).
  const bool own_transaction = sqlite3_get_autocommit(db_) != 0;
  if (own_transaction) KILN_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  absl::StatusOr<int64_t> kept = ThinStepsLocked(job_id, *count);
  absl::Status status = kept.status();
  if (status.ok() && own_transaction) status = Exec("COMMIT");
  if (!status.ok()) {
    if (own_transaction) Exec("ROLLBACK").IgnoreError();
    return status;
  }
  *count = *kept;
  return absl::OkStatus();
}

absl::Status JobStore::EpochAppendedLocked(const std::string& job_id) {
  KILN_ASSIGN_OR_RETURN(int64_t * count,
                        CountAppendedLocked(epoch_counts_, "epoch_metrics", job_id));
  if (*count <= options_.max_epoch_events_per_job) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(DropOldestEpochsLocked(job_id, *count));
  *count = options_.max_epoch_events_per_job;
  return absl::OkStatus();
}

absl::Status JobStore::DropOldestEpochsLocked(const std::string& job_id, int64_t count) {
  Statement s(db_,
              "DELETE FROM epoch_metrics WHERE job_id = ?1 AND seq IN (SELECT seq FROM "
              "epoch_metrics WHERE job_id = ?1 ORDER BY seq LIMIT ?2)");
  KILN_RETURN_IF_ERROR(s.status());
  s.Bind(1, job_id);
  s.Bind(2, count - options_.max_epoch_events_per_job);
  return s.Run();
}

absl::StatusOr<int64_t> JobStore::ThinStepsLocked(const std::string& job_id, int64_t count) {
  const int64_t keep_whole = options_.max_step_events_per_job / 2;
  const int64_t older_budget = options_.max_step_events_per_job / 4;
  // The oldest of the steps kept whole; everything before it is thinned.
  int64_t boundary = 0;
  {
    Statement s(db_,
                "SELECT seq FROM step_metrics WHERE job_id = ? ORDER BY seq DESC LIMIT 1 OFFSET ?");
    KILN_RETURN_IF_ERROR(s.status());
    s.Bind(1, job_id);
    s.Bind(2, keep_whole - 1);
    absl::Status status;
    const bool found = s.Step(&status);
    KILN_RETURN_IF_ERROR(status);
    if (!found) return count;
    boundary = s.Int(0);
  }
  auto older = [&](const char* what, int64_t stride) -> absl::StatusOr<int64_t> {
    Statement s(db_, absl::StrCat("SELECT ", what,
                                  " FROM step_metrics WHERE job_id = ? AND seq < ? AND "
                                  "global_step % ? = 0")
                         .c_str());
    KILN_RETURN_IF_ERROR(s.status());
    s.Bind(1, job_id);
    s.Bind(2, boundary);
    s.Bind(3, stride);
    absl::Status status;
    const int64_t value = s.Step(&status) ? s.Int(0) : 0;
    KILN_RETURN_IF_ERROR(status);
    return value;
  };
  // Past the largest step number no stride keeps fewer: only step 0 is a multiple of it. The
  // magnitude is taken here, saturating: SQLite's abs() fails on INT64_MIN, and a stored number
  // must never stop the store.
  KILN_ASSIGN_OR_RETURN(const int64_t most, older("COALESCE(MAX(global_step), 0)", 1));
  KILN_ASSIGN_OR_RETURN(const int64_t least, older("COALESCE(MIN(global_step), 0)", 1));
  const int64_t largest = std::max(most, least == INT64_MIN ? INT64_MAX : -least);
  int64_t stride = 1;
  KILN_ASSIGN_OR_RETURN(int64_t kept, older("COUNT(*)", stride));
  while (kept > older_budget && stride <= largest && stride < (int64_t{1} << 62)) {
    stride *= 2;
    KILN_ASSIGN_OR_RETURN(kept, older("COUNT(*)", stride));
  }
  if (stride > 1) {
    Statement s(db_,
                "DELETE FROM step_metrics WHERE job_id = ? AND seq < ? AND global_step % ? != 0");
    KILN_RETURN_IF_ERROR(s.status());
    s.Bind(1, job_id);
    s.Bind(2, boundary);
    s.Bind(3, stride);
    KILN_RETURN_IF_ERROR(s.Run());
  }
  if (kept > older_budget) {
    // Step numbers repeated (resumes) or all 0: the oldest go.
    Statement s(db_,
                "DELETE FROM step_metrics WHERE job_id = ?1 AND seq IN (SELECT seq FROM "
                "step_metrics WHERE job_id = ?1 AND seq < ?2 ORDER BY seq LIMIT ?3)");
    KILN_RETURN_IF_ERROR(s.status());
    s.Bind(1, job_id);
    s.Bind(2, boundary);
    s.Bind(3, kept - older_budget);
    KILN_RETURN_IF_ERROR(s.Run());
    kept = older_budget;
  }
  return keep_whole + kept;
}

namespace {

// Columns kilnd only ever fills with integers of 0 or more, by table: a row holding anything else
// was not written by kilnd (or by a worker before reports were checked), and its job is damaged.
struct RowRule {
  const char* table;
  const char* what;  // one row, as the reason says it
  std::vector<const char*> columns;
};
const RowRule kRowRules[] = {
    {"step_metrics", "step record", {"epoch", "step_in_epoch", "steps_per_epoch", "global_step"}},
    {"epoch_metrics", "epoch record", {"epoch", "test_samples"}},
    {"checkpoints", "checkpoint record", {"epochs_done", "global_step", "size_bytes"}},
};

std::string BadValueSql(const RowRule& rule) {
  std::vector<std::string> parts;
  for (const char* c : rule.columns) {
    parts.push_back(absl::StrCat("typeof(", c, ") <> 'integer' OR ", c, " < 0"));
  }
  return absl::StrCat("(", absl::StrJoin(parts, " OR "), ")");
}

// What the first of the `bad_rows` rows of `job_id` that break `rule` holds, for the reason.
absl::StatusOr<std::string> DescribeDamage(sqlite3* db, const RowRule& rule,
                                           const std::string& job_id, int64_t bad_rows) {
  Statement s(db,
              absl::StrCat("SELECT seq, ", absl::StrJoin(rule.columns, ", "), " FROM ", rule.table,
                           " WHERE job_id = ? AND ", BadValueSql(rule), " ORDER BY seq LIMIT 1")
                  .c_str());
  KILN_RETURN_IF_ERROR(s.status());
  s.Bind(1, job_id);
  absl::Status status;
  std::vector<std::string> values;
  std::string seq;
  if (s.Step(&status)) {
    seq = s.Text(0);
    for (size_t i = 0; i < rule.columns.size(); ++i) {
      const int c = static_cast<int>(i) + 1;
      if (s.Type(c) != SQLITE_INTEGER || s.Int(c) < 0) {
        values.push_back(
            absl::StrCat(rule.columns[i], " ", s.Type(c) == SQLITE_NULL ? "NULL" : s.Text(c)));
      }
    }
  }
  KILN_RETURN_IF_ERROR(status);
  return absl::StrCat(bad_rows, " ", rule.what, bad_rows == 1 ? " holds" : "s hold",
                      " a value kilnd never writes (seq ", seq, ": ", absl::StrJoin(values, ", "),
                      ")");
}

}  // namespace

absl::Status JobStore::CheckAndThinAllJobs() {
  std::lock_guard<std::mutex> lock(mu_);
  // One pass over each table, by job: the steps and epochs to count, and the rows no kilnd
  // writes.
  for (const RowRule& rule : kRowRules) {
    const bool steps = &rule == &kRowRules[0];
    Statement s(db_, absl::StrCat("SELECT job_id, COUNT(*), SUM(", BadValueSql(rule), ") FROM ",
                                  rule.table, " GROUP BY job_id")
                         .c_str());
    KILN_RETURN_IF_ERROR(s.status());
    absl::Status status;
    std::vector<std::pair<std::string, int64_t>> bad;
    while (s.Step(&status)) {
      if (steps) step_counts_[s.Text(0)] = s.Int(1);
      if (&rule == &kRowRules[1]) epoch_counts_[s.Text(0)] = s.Int(1);
      if (s.Int(2) > 0) bad.emplace_back(s.Text(0), s.Int(2));
    }
    KILN_RETURN_IF_ERROR(status);
    for (const auto& [job_id, rows] : bad) {
      KILN_ASSIGN_OR_RETURN(const std::string what, DescribeDamage(db_, rule, job_id, rows));
      std::string& reason = damaged_[job_id];
      absl::StrAppend(&reason, reason.empty() ? "" : "; ", what);
    }
  }
  for (auto& [job_id, count] : epoch_counts_) {
    if (count <= options_.max_epoch_events_per_job) continue;
    if (absl::Status s = DropOldestEpochsLocked(job_id, count); !s.ok()) {
      if (s.code() == absl::StatusCode::kUnavailable) return s;
      std::string& reason = damaged_[job_id];
      absl::StrAppend(&reason, reason.empty() ? "" : "; ",
                      "its epoch history cannot be trimmed: ", s.message());
      continue;
    }
    count = options_.max_epoch_events_per_job;
  }
  for (auto& [job_id, count] : step_counts_) {
    if (count <= options_.max_step_events_per_job) continue;
    KILN_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    absl::StatusOr<int64_t> kept = ThinStepsLocked(job_id, count);
    absl::Status status = kept.status();
    if (status.ok()) status = Exec("COMMIT");
    if (!status.ok()) {
      Exec("ROLLBACK").IgnoreError();
      // A full or failing disk stops the start as before; anything else is this job's rows.
      if (status.code() == absl::StatusCode::kUnavailable) return status;
      std::string& reason = damaged_[job_id];
      absl::StrAppend(&reason, reason.empty() ? "" : "; ",
                      "its step history cannot be thinned: ", status.message());
      continue;
    }
    count = *kept;
  }
  return absl::OkStatus();
}

std::map<std::string, std::string> JobStore::DamagedJobs() {
  std::lock_guard<std::mutex> lock(mu_);
  return damaged_;
}

absl::StatusOr<v1::Job> JobStore::GetJob(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement s(db_, absl::StrCat("SELECT ", kJobColumns,
                                " FROM jobs j JOIN specs s ON s.job_id = j.id WHERE j.id = ?")
                       .c_str());
  KILN_RETURN_IF_ERROR(s.status());
  s.Bind(1, job_id);
  absl::Status status;
  if (s.Step(&status)) return JobFromRow(s);
  KILN_RETURN_IF_ERROR(status);
  return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
}

absl::StatusOr<std::vector<v1::Job>> JobStore::AllJobs() {
  std::lock_guard<std::mutex> lock(mu_);
  Statement s(db_, absl::StrCat("SELECT ", kJobColumns,
                                " FROM jobs j JOIN specs s ON s.job_id = j.id ORDER BY j.rowid")
                       .c_str());
  KILN_RETURN_IF_ERROR(s.status());
  std::vector<v1::Job> jobs;
  absl::Status status;
  while (s.Step(&status)) jobs.push_back(JobFromRow(s));
  KILN_RETURN_IF_ERROR(status);
  return jobs;
}

absl::StatusOr<JobPage> JobStore::ListJobs(const std::vector<v1::JobState>& states, int page_size,
                                           const std::string& page_token,
                                           const std::optional<std::string>& team) {
  int64_t before = INT64_MAX;
  if (!page_token.empty() && (!absl::SimpleAtoi(page_token, &before) || before <= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token: \"", page_token, "\" is not a token from ListJobs"));
  }
  std::string where = "j.rowid < ?1";
  if (!states.empty()) {
    std::vector<int> values(states.begin(), states.end());
    absl::StrAppend(&where, " AND j.state IN (", absl::StrJoin(values, ", "), ")");
  }
  if (team.has_value()) absl::StrAppend(&where, " AND j.owner_team IN ('', ?3)");
  std::lock_guard<std::mutex> lock(mu_);
  Statement s(db_, absl::StrCat("SELECT ", kJobColumns,
                                " FROM jobs j JOIN specs s ON s.job_id = j.id WHERE ", where,
                                " ORDER BY j.rowid DESC LIMIT ?2")
                       .c_str());
  KILN_RETURN_IF_ERROR(s.status());
  s.Bind(1, before);
  s.Bind(2, page_size + 1);  // one more tells whether another page follows
  if (team.has_value()) s.Bind(3, *team);
  JobPage page;
  absl::Status status;
  int64_t last_rowid = 0;
  while (s.Step(&status)) {
    if (static_cast<int>(page.jobs.size()) == page_size) {
      page.next_page_token = absl::StrCat(last_rowid);
      break;
    }
    last_rowid = s.Int(0);
    page.jobs.push_back(JobFromRow(s));
  }
  KILN_RETURN_IF_ERROR(status);
  return page;
}

absl::StatusOr<std::vector<v1::JobEvent>> JobStore::EventsPage(const std::string& job_id,
                                                               int64_t after_seq, int64_t max_seq,
                                                               bool include_steps, int limit) {
  if (limit < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("job store: a page of events holds at least 1, got ", limit));
  }
  after_seq = std::max<int64_t>(after_seq, 0);  // seq 0: a checkpoint not yet announced
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::JobEvent> events;
  absl::Status status;
  auto add = [&](int64_t seq, int64_t time_ms) -> v1::JobEvent& {
    v1::JobEvent& e = events.emplace_back();
    e.set_seq(seq);
    *e.mutable_time() = MillisToTimestamp(time_ms);
    e.set_replayed(true);
    return e;
  };
  // The page ends at its limit-th event's seq (max_seq when fewer are left); each table is then
  // read over (after_seq, last_seq], which holds no more than `limit` events in all.
  int64_t last_seq = max_seq;
  {
    const char* kRange = " WHERE job_id = ?1 AND seq > ?2 AND seq <= ?3";
    std::string sql = absl::StrCat("SELECT seq FROM state_changes", kRange);
    if (include_steps) absl::StrAppend(&sql, " UNION ALL SELECT seq FROM step_metrics", kRange);
    absl::StrAppend(&sql, " UNION ALL SELECT seq FROM epoch_metrics", kRange,
                    " UNION ALL SELECT seq FROM checkpoints", kRange,
                    " ORDER BY seq LIMIT 1 OFFSET ?4");
    Statement s(db_, sql.c_str());
    KILN_RETURN_IF_ERROR(s.status());
    s.Bind(1, job_id);
    s.Bind(2, after_seq);
    s.Bind(3, max_seq);
    s.Bind(4, limit - 1);
    if (s.Step(&status)) last_seq = s.Int(0);
    KILN_RETURN_IF_ERROR(status);
  }
  {
    Statement s(db_,
                "SELECT seq, time_ms, state, reason FROM state_changes "
                "WHERE job_id = ? AND seq > ? AND seq <= ?");
    KILN_RETURN_IF_ERROR(s.status());
    s.Bind(1, job_id);
    s.Bind(2, after_seq);
    s.Bind(3, last_seq);
    while (s.Step(&status)) {
      v1::StateChange* c = add(s.Int(0), s.Int(1)).mutable_state();
      c->set_state(static_cast<v1::JobState>(s.Int(2)));
      c->set_reason(s.Text(3));
    }
    KILN_RETURN_IF_ERROR(status);
  }
  if (include_steps) {
    Statement s(db_,
                "SELECT seq, time_ms, epoch, step_in_epoch, steps_per_epoch, global_step, loss, "
                "lr, samples_per_sec, rank_samples_per_sec FROM step_metrics "
                "WHERE job_id = ? AND seq > ? AND seq <= ?");
    KILN_RETURN_IF_ERROR(s.status());
    s.Bind(1, job_id);
    s.Bind(2, after_seq);
    s.Bind(3, last_seq);
    while (s.Step(&status)) {
      v1::StepMetrics* m = add(s.Int(0), s.Int(1)).mutable_step();
      m->set_epoch(static_cast<int32_t>(s.Int(2)));
      m->set_step_in_epoch(static_cast<int32_t>(s.Int(3)));
      m->set_steps_per_epoch(static_cast<int32_t>(s.Int(4)));
      m->set_global_step(s.Int(5));
      m->set_loss(static_cast<float>(s.Real(6)));
      m->set_lr(static_cast<float>(s.Real(7)));
      m->set_samples_per_sec(s.Real(8));
      UnpackDoubles(s.Blob(9), m->mutable_rank_samples_per_sec());
    }
    KILN_RETURN_IF_ERROR(status);
  }
  {
    Statement s(db_,
                "SELECT seq, time_ms, epoch, train_loss, train_accuracy, test_loss, "
                "test_accuracy, test_samples, train_seconds, samples_per_sec, lr "
                "FROM epoch_metrics WHERE job_id = ? AND seq > ? AND seq <= ?");
    KILN_RETURN_IF_ERROR(s.status());
    s.Bind(1, job_id);
    s.Bind(2, after_seq);
    s.Bind(3, last_seq);
    while (s.Step(&status)) {
      v1::EpochMetrics* m = add(s.Int(0), s.Int(1)).mutable_epoch();
      m->set_epoch(static_cast<int32_t>(s.Int(2)));
      m->set_train_loss(s.Real(3));
      m->set_train_accuracy(s.Real(4));
      m->set_test_loss(s.Real(5));
      m->set_test_accuracy(s.Real(6));
      m->set_test_samples(s.Int(7));
      m->set_train_seconds(s.Real(8));
      m->set_samples_per_sec(s.Real(9));
      m->set_lr(static_cast<float>(s.Real(10)));
    }
    KILN_RETURN_IF_ERROR(status);
  }
  {
    Statement s(db_, absl::StrCat("SELECT ", kCheckpointColumns,
                                  " FROM checkpoints WHERE job_id = ? AND seq > ? AND seq <= ?")
                         .c_str());
    KILN_RETURN_IF_ERROR(s.status());
    s.Bind(1, job_id);
    s.Bind(2, after_seq);
    s.Bind(3, last_seq);
    while (s.Step(&status)) {
      v1::Checkpoint c = CheckpointFromRow(s);
      *add(s.Int(2), TimestampToMillis(c.create_time())).mutable_checkpoint() = std::move(c);
    }
    KILN_RETURN_IF_ERROR(status);
  }
  std::sort(events.begin(), events.end(),
            [](const v1::JobEvent& a, const v1::JobEvent& b) { return a.seq() < b.seq(); });
  return events;
}

absl::StatusOr<int64_t> JobStore::MaxSeq(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  return QueryInt64Locked(
      "SELECT MAX(m) FROM ("
      "SELECT MAX(seq) AS m FROM state_changes WHERE job_id = ?1 UNION ALL "
      "SELECT MAX(seq) FROM step_metrics WHERE job_id = ?1 UNION ALL "
      "SELECT MAX(seq) FROM epoch_metrics WHERE job_id = ?1 UNION ALL "
      "SELECT MAX(seq) FROM checkpoints WHERE job_id = ?1)",
      job_id);
}

absl::StatusOr<int64_t> JobStore::QueryInt64Locked(const char* sql, const std::string& arg) {
  Statement s(db_, sql);
  KILN_RETURN_IF_ERROR(s.status());
  s.Bind(1, arg);
  absl::Status status;
  int64_t value = 0;  // also for a NULL (no rows to take the MAX of)
  if (s.Step(&status)) value = s.Int(0);
  KILN_RETURN_IF_ERROR(status);
  return value;
}

absl::Status JobStore::InsertCheckpoint(v1::Checkpoint* c) {
  std::lock_guard<std::mutex> lock(mu_);
  const SyncedCommits synced(this);
  Statement s(db_,
              "INSERT INTO checkpoints (job_id, seq, kind, epochs_done, global_step, "
              "test_accuracy, size_bytes, create_ms, path, sha256) "
              "VALUES (?, 0, ?, ?, ?, ?, ?, ?, ?, ?)");
  KILN_RETURN_IF_ERROR(s.status());
  s.Bind(1, c->job_id());
  s.Bind(2, static_cast<int>(c->kind()));
  s.Bind(3, c->epochs_done());
  s.Bind(4, c->global_step());
  s.Bind(5, c->test_accuracy());
  s.Bind(6, c->size_bytes());
  s.Bind(7, TimestampToMillis(c->create_time()));
  s.Bind(8, c->path());
  s.Bind(9, c->sha256());
  KILN_RETURN_IF_ERROR(s.Run());
  c->set_id(sqlite3_last_insert_rowid(db_));
  return absl::OkStatus();
}

absl::Status JobStore::ProbeWrite() {
  std::lock_guard<std::mutex> lock(mu_);
  KILN_RETURN_IF_ERROR(
      Exec("CREATE TABLE IF NOT EXISTS write_probe (id INTEGER PRIMARY KEY, time_ms INTEGER)"));
  Statement s(db_, "INSERT OR REPLACE INTO write_probe (id, time_ms) VALUES (1, ?)");
  KILN_RETURN_IF_ERROR(s.status());
  s.Bind(1, NowMillis());
  return s.Run();
}

absl::Status JobStore::DeleteCheckpoint(int64_t checkpoint_id) {
  std::lock_guard<std::mutex> lock(mu_);
  const SyncedCommits synced(this);
  // The row stays, marked, so the job's history still shows that the checkpoint was written.
  Statement s(db_, "UPDATE checkpoints SET deleted = 1 WHERE id = ?");
  KILN_RETURN_IF_ERROR(s.status());
  s.Bind(1, checkpoint_id);
  return s.Run();
}

absl::StatusOr<std::vector<v1::Checkpoint>> JobStore::Checkpoints(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement s(db_, absl::StrCat("SELECT ", kCheckpointColumns,
                                " FROM checkpoints WHERE job_id = ? AND deleted = 0 ORDER BY id")
                       .c_str());
  KILN_RETURN_IF_ERROR(s.status());
  s.Bind(1, job_id);
  std::vector<v1::Checkpoint> out;
  absl::Status status;
  while (s.Step(&status)) out.push_back(CheckpointFromRow(s));
  KILN_RETURN_IF_ERROR(status);
  return out;
}

absl::StatusOr<int64_t> JobStore::CheckpointBytesOfTeam(const std::string& team) {
  std::lock_guard<std::mutex> lock(mu_);
  return QueryInt64Locked(
      "SELECT COALESCE(SUM(c.size_bytes), 0) FROM checkpoints c JOIN jobs j ON j.id = c.job_id "
      "WHERE j.owner_team = ?1 AND c.deleted = 0",
      team);
}

absl::Status JobStore::SetModelDeployments(const std::string& model,
                                           const std::vector<StoredDeployment>& versions) {
  std::lock_guard<std::mutex> lock(mu_);
  const SyncedCommits synced(this);
  KILN_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  absl::Status status;
  {
    Statement del(db_, "DELETE FROM deployments WHERE model = ?");
    status = del.status();
    if (status.ok()) {
      del.Bind(1, model);
      status = del.Run();
    }
  }
  for (const StoredDeployment& d : versions) {
    if (!status.ok()) break;
    Statement ins(db_, "INSERT INTO deployments (model, version, load_request) VALUES (?, ?, ?)");
    status = ins.status();
    if (!status.ok()) break;
    ins.Bind(1, model);
    ins.Bind(2, d.version);
    ins.BindBlob(3, d.load_request);
    status = ins.Run();
  }
  if (!status.ok()) {
    Exec("ROLLBACK").IgnoreError();
    return status;
  }
  return Exec("COMMIT");
}

absl::StatusOr<std::vector<StoredDeployment>> JobStore::Deployments() {
  std::lock_guard<std::mutex> lock(mu_);
  Statement s(db_, "SELECT model, version, load_request, restoring FROM deployments ORDER BY seq");
  KILN_RETURN_IF_ERROR(s.status());
  std::vector<StoredDeployment> out;
  absl::Status status;
  while (s.Step(&status)) out.push_back({s.Text(0), s.Text(1), s.Blob(2), s.Int(3) != 0});
  KILN_RETURN_IF_ERROR(status);
  return out;
}

absl::Status JobStore::MarkDeploymentRestoring(const std::string& model,
                                               const std::string& version) {
  return SetDeploymentRestoring(model, version, 1);
}

absl::Status JobStore::ClearDeploymentRestoring(const std::string& model,
                                                const std::string& version) {
  return SetDeploymentRestoring(model, version, 0);
}

absl::Status JobStore::SetDeploymentRestoring(const std::string& model, const std::string& version,
                                              int64_t restoring) {
  std::lock_guard<std::mutex> lock(mu_);
  // Synced: the mark must be on disk before the load that may kill kilnd starts.
  const SyncedCommits synced(this);
  Statement s(db_, "UPDATE deployments SET restoring = ? WHERE model = ? AND version = ?");
  KILN_RETURN_IF_ERROR(s.status());
  s.Bind(1, restoring);
  s.Bind(2, model);
  s.Bind(3, version);
  KILN_RETURN_IF_ERROR(s.Run());
  if (sqlite3_changes(db_) == 0) {
    return absl::NotFoundError(absl::StrCat("job store: no deployment of model \"", model,
                                            "\" version \"", version, "\" is recorded"));
  }
  return absl::OkStatus();
}

}  // namespace kiln::server
