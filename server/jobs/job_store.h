// The durable record of kilnd: jobs, their specs, states, events (state changes, step and epoch
// metrics) and the checkpoint index, in one SQLite database in WAL mode.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/v1/training.pb.h"

struct sqlite3;

namespace kiln::server {

// One page of ListJobs.
struct JobPage {
  std::vector<v1::Job> jobs;
  std::string next_page_token;  // empty on the last page
};

// One served version as the inference service recorded it: `load_request` is what to replay at
// start (opaque here: the serving side's own encoding).
struct StoredDeployment {
  std::string model, version;
  std::string load_request;
  // Marked while kilnd loads it at start (MarkDeploymentRestoring); still marked when read at the
  // next start, that start died loading it.
  bool restoring = false;
};

struct JobStoreOptions {
  // The most step events kept per job. Past it, the newest half stay and older steps are thinned
  // to a power-of-two stride of global_step (see ThinStepsLocked); state and checkpoint events
  // are always kept (epochs have a bound of their own). At least kMinStepEventsPerJob.
  int64_t max_step_events_per_job = 10'000;
  // The most epoch events kept per job (at least 1); past it the oldest go. A job's epochs are
  // bounded (--max_epochs), but a job retried or resumed again and again repeats them.
  int64_t max_epoch_events_per_job = 20'000;
};

// All methods are thread-safe; each write is one transaction.
class JobStore {
 public:
  // The schema version this code reads and writes; older databases are migrated on open.
  static constexpr int kSchemaVersion = 9;
  static constexpr int64_t kMinStepEventsPerJob = 100;

  // Opens (creating if needed) the database at `path`, and thins the step and epoch history of
  // every job over its bound (a store from an older kilnd, or a lowered bound).
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path,
                                                        JobStoreOptions options = {});
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // Inserts or updates the job row (everything but events). With `event`, the event is appended
  // in the same transaction, so a state and its announcement are never apart.
  absl::Status PutJob(const v1::Job& job, const v1::JobEvent* event = nullptr);
  // Appends one event (seq must be new for the job). A step past the job's bound thins its older
  // steps, one pass per quarter of the bound, so the cost per step stays constant.
  absl::Status AppendEvent(const std::string& job_id, const v1::JobEvent& event);

  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);
  // Every job, oldest first: for recovery at start.
  absl::StatusOr<std::vector<v1::Job>> AllJobs();
  // Newest first, filtered by state (none: all), after the position in `page_token`.
  // `team` set: only jobs of that team and of no team (those every team sees).
  absl::StatusOr<JobPage> ListJobs(const std::vector<v1::JobState>& states, int page_size,
                                   const std::string& page_token,
                                   const std::optional<std::string>& team = std::nullopt);

  // One page of the job's events: the first `limit` (at least 1) with after_seq < seq <= max_seq,
  // in seq order, marked replayed; step events only if include_steps. Fewer than `limit`: the
  // last page.
  absl::StatusOr<std::vector<v1::JobEvent>> EventsPage(const std::string& job_id, int64_t after_seq,
                                                       int64_t max_seq, bool include_steps,
                                                       int limit);
  // A one-row write that commits like any other: OK when the store takes writes again.
  absl::Status ProbeWrite();
  // The largest seq recorded for the job, 0 if none.
  absl::StatusOr<int64_t> MaxSeq(const std::string& job_id);

  // Records a checkpoint; sets its id.
  absl::Status InsertCheckpoint(v1::Checkpoint* checkpoint);
  // Drops a checkpoint from the index (its file is the caller's to delete).
  absl::Status DeleteCheckpoint(int64_t checkpoint_id);
  // The job's indexed checkpoints, oldest first.
  absl::StatusOr<std::vector<v1::Checkpoint>> Checkpoints(const std::string& job_id);
  // The bytes of the indexed checkpoints of `team`'s jobs (Job.owner.team).
  absl::StatusOr<int64_t> CheckpointBytesOfTeam(const std::string& team);

  // Replaces everything recorded of `model` with `versions` (oldest first; empty: the model is
  // gone), in one synced transaction.
  absl::Status SetModelDeployments(const std::string& model,
                                   const std::vector<StoredDeployment>& versions);
  // Every recorded deployment: models in the order they were last written, versions oldest first.
  absl::StatusOr<std::vector<StoredDeployment>> Deployments();
  // Marks the recorded deployment as being loaded at start, in a synced write, before the load;
  // ClearDeploymentRestoring unmarks it once the load is over. SetModelDeployments writes its
  // rows unmarked. NotFound when nothing is recorded as `model` `version`.
  absl::Status MarkDeploymentRestoring(const std::string& model, const std::string& version);
  absl::Status ClearDeploymentRestoring(const std::string& model, const std::string& version);

  // The jobs whose rows Open found damaged, each with what is wrong: a negative or non-integer
  // step, epoch, position or size (values kilnd never writes), or a step history that could not be
  // thinned. Their rows stay as they are, for a person to look at; JobManager::Recover fails
  // such jobs instead of running them.
  std::map<std::string, std::string> DamagedJobs();

 private:
  JobStore(sqlite3* db, JobStoreOptions options) : db_(db), options_(options) {}
  absl::Status Migrate();
  // At open: finds the jobs whose rows hold values kilnd never writes (DamagedJobs), and thins
  // every job's steps and epochs that are over their bounds. Only a store that cannot be read or
  // written fails it: one job's rows never stop kilnd from starting.
  absl::Status CheckAndThinAllJobs();
  absl::Status Exec(const char* sql);
  // Sets the deployment's restoring column (0 or 1) in a synced write.
  absl::Status SetDeploymentRestoring(const std::string& model, const std::string& version,
                                      int64_t restoring);
  // While alive (mu_ held), commits sync the write-ahead log (synchronous=FULL): for what is
  // announced to clients once committed (job states, checkpoint records), which a power failure
  // must not take back. Step metrics stay at NORMAL: one fsync a step would slow training, and
  // losing the last steps' metrics on power loss loses nothing announced as final.
  class SyncedCommits {
   public:
    explicit SyncedCommits(JobStore* store);
    ~SyncedCommits();
    SyncedCommits(const SyncedCommits&) = delete;
    SyncedCommits& operator=(const SyncedCommits&) = delete;

   private:
    JobStore* store_;
  };
  absl::Status AppendEventLocked(const std::string& job_id, const v1::JobEvent& event);
  absl::Status PutJobLocked(const v1::Job& job);
  // The first column of the first row of `sql` with `arg` bound to ?1; 0 when there is none.
  absl::StatusOr<int64_t> QueryInt64Locked(const char* sql, const std::string& arg);
  // Counts the step just appended and thins the job's steps when over the bound.
  absl::Status StepAppendedLocked(const std::string& job_id);
  // The job's rows in `table` (step_metrics, epoch_metrics) after one more was appended: cached
  // in `counts`, counted in the table the first time.
  absl::StatusOr<int64_t*> CountAppendedLocked(std::map<std::string, int64_t>& counts,
                                               const char* table, const std::string& job_id);
  // Counts the epoch just appended and drops the job's oldest over the bound.
  absl::Status EpochAppendedLocked(const std::string& job_id);
  absl::Status DropOldestEpochsLocked(const std::string& job_id, int64_t count);
  // Keeps the newest max/2 steps; of the older ones, those whose global_step is a multiple of the
  // smallest power of two that fits them into max/4 (then, if still over, the newest max/4).
  // Returns how many steps the job keeps.
  absl::StatusOr<int64_t> ThinStepsLocked(const std::string& job_id, int64_t count);

  std::mutex mu_;
  sqlite3* db_;
  const JobStoreOptions options_;
  // Step events stored per job, counted once per job and then kept up to date (under mu_).
  std::map<std::string, int64_t> step_counts_;
  std::map<std::string, int64_t> epoch_counts_;  // the same for epoch events
  std::map<std::string, std::string> damaged_;   // by job; found at open (under mu_)
};

}  // namespace kiln::server
