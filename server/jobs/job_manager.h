// The core of kilnd: validates and queues jobs (FIFO per device, a bounded number running per
// device), runs each attempt on a thread of its own (JobRunner), persists every state change
// before announcing it (JobEvents), and recovers jobs after a restart. Knows nothing of gRPC.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kiln/v1/training.pb.h"
#include "server/checkpoints/checkpoint_export.h"
#include "server/datasets/dataset_catalog.h"
#include "server/jobs/event_replay.h"
#include "server/jobs/job_admission.h"
#include "server/jobs/job_event_observer.h"
#include "server/jobs/job_events.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/job_store.h"
#include "server/jobs/metric_broadcaster.h"
#include "server/jobs/spec_translation.h"
#include "server/jobs/worker_job_runner.h"
#include "server/scheduling/queue_order.h"

namespace kiln::server {

struct JobManagerOptions {
  std::string state_dir;               // checkpoints go to state_dir/checkpoints/<job>/
  std::string default_device = "cpu";  // for specs without a device; "auto" is resolved
  int max_jobs_per_device = 1;
  int max_queued_jobs = 1000;  // per daemon; more is RESOURCE_EXHAUSTED
  // A job found running at start without a clean shutdown is resumed at most this many times
  // over its life; the next time it fails (Job.crash_resumes).
  int max_crash_resumes = 3;
  SpecLimits limits;
  // Events a WatchJob replay reads from the store at a time (and so holds at most).
  int replay_page_events = 256;
  // For tests only: a pause after every training step, to make jobs last predictably.
  absl::Duration step_delay = absl::ZeroDuration();
  // Told of every job event, in this order (metrics, the event log); not owned.
  std::vector<JobEventObserver*> observers;
  // Called (under the manager's lock: it must not call back) when the store stops taking writes
  // (false: a full or failing disk) and when it takes them again (true).
  std::function<void(bool writable)> on_store_writable;
  // While the store refuses writes: how often the unrecorded state changes are tried again.
  absl::Duration store_retry_interval = absl::Seconds(2);
  // What one team may run at once (--team_max_running_jobs, --team_max_gpus; 0: no limit).
  TeamQuota team_quota;
  // Called (under the manager's lock: it must not call back) when `waiting` asks `preempted` to
  // stop for its slot: metrics and the event log.
  std::function<void(const v1::Job& preempted, const v1::Job& waiting)> on_preempt;
  // Jobs of several workers (JobSpec.workers): how they are started and coordinated. Without a
  // registry (workers.registry null) such jobs are refused at Submit.
  WorkerRunnerOptions workers;
};

// What WatchJob streams of one job, in this order: its current state (live_only), its recorded
// history (read from the store in pages), then its live events. Live events start right after
// the history's last seq: none is missed, none comes twice.
struct JobWatch {
  std::optional<v1::JobEvent> current_state;  // live_only: the one event before live ones
  std::unique_ptr<EventReplay> history;       // null with live_only
  std::shared_ptr<Subscription> live;         // null when the job had already ended
};

// The NotFound a lookup of a job that is not there answers (also one another team owns).
absl::Status JobNotFound(const std::string& job_id);

// Thread-safe.
class JobManager {
 public:
  JobManager(JobStore* store, MetricBroadcaster* broadcaster, DatasetCatalog* datasets,
             JobManagerOptions options);
  ~JobManager();  // Shutdown() with a long deadline if not done yet

  // Loads the store: RUNNING jobs are queued again ahead of QUEUED ones and resume from their
  // latest checkpoint. Call once, before anything else.
  absl::Status Recover();

  // `owner`: who submits it, recorded in the job (Job.owner).
  absl::StatusOr<v1::Job> Submit(const v1::JobSpec& spec, const v1::Owner& owner = {});
  absl::StatusOr<v1::Job> Get(const std::string& job_id);
  // The team of the job's owner (Job.owner.team; empty for none), without copying the job.
  absl::StatusOr<std::string> OwnerTeam(const std::string& job_id);
  // `team` set: only that team's jobs and those of no team (JobStore::ListJobs).
  absl::StatusOr<JobPage> List(const std::vector<v1::JobState>& states, int page_size,
                               const std::string& page_token,
                               const std::optional<std::string>& team = std::nullopt);
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id);
  // checkpoint_id 0: from the newest checkpoint that verifies; else from that one (which must
  // verify: DATA_LOSS otherwise), pinned in the job until the run writes its own.
  // FailedPrecondition also when the job's dataset has been deleted since.
  absl::StatusOr<v1::Job> Resume(const std::string& job_id, int epochs, int64_t checkpoint_id = 0);
  // Deletes a dataset no queued or running job uses (FailedPrecondition naming those that do).
  // Submit checks under the same lock that its dataset is still there, so a submission and a
  // deletion cannot both succeed.
  absl::Status DeleteDataset(const std::string& name);
  absl::StatusOr<JobWatch> Watch(const std::string& job_id, bool include_steps, bool live_only);
  // Asks the running job for a checkpoint after its current step; `done` runs once, on the
  // training thread or (on error) on this one.
  void RequestCheckpoint(const std::string& job_id, CheckpointDone done);
  absl::StatusOr<std::vector<v1::Checkpoint>> ListCheckpoints(const std::string& job_id);
  // Drops the checkpoint from the index, then deletes its file; FAILED_PRECONDITION when it is
  // the one a queued or running job is to start from. Models served from it keep their weights.
  absl::StatusOr<v1::Checkpoint> DeleteCheckpoint(const std::string& job_id, int64_t checkpoint_id);
  // checkpoint_id 0: the latest.
  absl::StatusOr<v1::Checkpoint> FindCheckpoint(const std::string& job_id, int64_t checkpoint_id);
  // The checkpoint's file, opened for export in chunks of `chunk_bytes` (checkpoint_id 0: the
  // latest); NotFound for an unknown job or checkpoint or a file gone missing.
  absl::StatusOr<std::unique_ptr<CheckpointExport>> ExportCheckpoint(const std::string& job_id,
                                                                     int64_t checkpoint_id,
                                                                     int chunk_bytes);

  // The token the workers of a job of several workers present (x-kiln-worker-token);
  // FailedPrecondition for a job that runs in kilnd's process.
  absl::StatusOr<std::string> WorkerToken(const std::string& job_id);

  // The bytes of the checkpoints `team`'s jobs keep (JobStore::CheckpointBytesOfTeam).
  absl::StatusOr<int64_t> CheckpointBytesOfTeam(const std::string& team) {
    return store_->CheckpointBytesOfTeam(team);
  }

  // Whether the store took the last write tried (false: read-only until it does again).
  bool store_writable();

  // Refuses new work, asks running jobs to checkpoint (per policy) and stop, and waits for them
  // until `deadline`. Jobs stopped this way stay RUNNING in the store, to resume on restart.
  // DeadlineExceeded when some did not stop in time.
  absl::Status Shutdown(absl::Duration deadline);

 private:
  absl::StatusOr<std::shared_ptr<JobSlot>> FindLocked(const std::string& job_id);
  // Records the change, then announces it and applies it to the slot; on a store error nothing
  // changes and the store is marked unwritable.
  absl::Status SetStateLocked(JobSlot& slot, v1::JobState state, const std::string& reason);
  // As SetStateLocked, but a change the store refuses is kept to retry (JobSlot::unrecorded_state).
  void SetOrQueueStateLocked(JobSlot& slot, v1::JobState state, const std::string& reason);
  void StoreFailedLocked(const absl::Status& error);
  // A job whose record the store found damaged at start: FAILED with `damage`, never run or
  // resumed again. Without `numbered` (its event numbers ran out) only its row says so.
  void FailDamagedLocked(JobSlot& slot, const std::string& damage, bool numbered);
  // UNAVAILABLE naming the store's last error while it refuses writes.
  absl::Status RequireWritableStoreLocked() const;
  // While the store refuses writes: retries the unrecorded changes, then a probe write; once
  // all pass, the store is writable again and queued jobs start.
  void StoreRetryLoop();
  void ScheduleLocked();
  // Who runs what, by team, over every device.
  std::map<std::string, TeamUsage> TeamUsageLocked() const;
  // The index in `queue` of the job to start next (StartOrder), skipping those whose team is at
  // its quota (each then says so); nullopt when none may.
  std::optional<size_t> NextToStartLocked(const std::deque<std::string>& queue);
  // Asks a running job of a lower priority on `waiting`'s device to stop for it
  // (ChoosePreemption); why `waiting` still waits, or empty when it preempts none.
  std::string PreemptForLocked(const JobSlot& waiting);
  // Records why a queued job waits (Job.reason), when it changed.
  void NoteWhyQueuedLocked(JobSlot& slot, const std::string& why);
  // A preempted job back in its queue (QUEUED, "preempted by JOB"), to resume from the
  // checkpoint it wrote on stopping.
  void RequeuePreemptedLocked(const std::shared_ptr<JobSlot>& slot);
  // False (nothing changed) when the store refused the job's RUNNING state.
  bool StartLocked(const std::shared_ptr<JobSlot>& slot);
  // Runs one attempt (JobRunner) on the slot's thread, then records how it ended.
  void RunJob(std::shared_ptr<JobSlot> slot);
  // A job of several workers: attempts (WorkerJobRunner) until one ends in success, a cancel or
  // a shutdown, or the job's max_retries are spent.
  absl::Status RunWorkerAttempts(JobSlot& slot);
  // The devices a queued job would hold if it started now: one for an ordinary job; for a gang
  // job on "cuda", `workers` GPUs each with a free slot, or none (and `why` says what it waits
  // for) when there are not that many.
  std::vector<std::string> DevicesToStartLocked(const JobSlot& slot, std::string* why);
  void ReapThreadsLocked();

  JobStore* store_;
  JobEvents events_;
  DatasetCatalog* datasets_;
  const JobManagerOptions options_;
  const JobRunnerOptions runner_options_;
  const JobAdmission admission_;

  std::mutex mu_;
  std::condition_variable idle_cv_;
  std::map<std::string, std::shared_ptr<JobSlot>> jobs_;
  std::map<std::string, std::deque<std::string>> queues_;  // by device
  std::map<std::string, int> running_;                     // by device
  std::set<std::string> damaged_;  // jobs whose record was damaged at start (FailDamagedLocked)
  int queued_count_ = 0;
  int active_threads_ = 0;
  bool shutting_down_ = false;
  std::vector<std::thread> finished_threads_;
  bool store_writable_ = true;
  std::string store_error_;  // the last write error while !store_writable_
  bool stop_store_retry_ = false;
  std::condition_variable store_retry_cv_;
  std::thread store_retry_;  // last: started once everything above exists
};

}  // namespace kiln::server
