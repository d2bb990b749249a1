// The durable record of kilnd: jobs, their specs, states, events (state changes, step and epoch
// metrics) and the checkpoint index, in one SQLite database in WAL mode.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
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

// All methods are thread-safe; each write is one transaction.
class JobStore {
 public:
  // The schema version this code reads and writes; older databases are migrated on open.
  static constexpr int kSchemaVersion = 4;

  // Opens (creating if needed) the database at `path`.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // Inserts or updates the job row (everything but events). With `event`, the event is appended
  // in the same transaction, so a state and its announcement are never apart.
  absl::Status PutJob(const v1::Job& job, const v1::JobEvent* event = nullptr);
  // Appends one event (seq must be new for the job).
  absl::Status AppendEvent(const std::string& job_id, const v1::JobEvent& event);

  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);
  // Every job, oldest first: for recovery at start.
  absl::StatusOr<std::vector<v1::Job>> AllJobs();
  // Newest first, filtered by state (none: all), after the position in `page_token`.
  absl::StatusOr<JobPage> ListJobs(const std::vector<v1::JobState>& states, int page_size,
                                   const std::string& page_token);

  // The job's events with seq <= max_seq, in seq order; step events only if include_steps.
  absl::StatusOr<std::vector<v1::JobEvent>> Events(const std::string& job_id, int64_t max_seq,
                                                   bool include_steps);
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

 private:
  explicit JobStore(sqlite3* db) : db_(db) {}
  absl::Status Migrate();
  absl::Status Exec(const char* sql);
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

  std::mutex mu_;
  sqlite3* db_;
};

}  // namespace kiln::server
