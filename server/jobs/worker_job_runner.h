// One attempt of a job of several workers: kilnd coordinates, the kiln-worker processes train.
// It picks the checkpoint to start from, opens the attempt to its workers (WorkerRegistry),
// starts them on this machine unless the job's workers come from elsewhere, turns their reports
// into the job's events once they check out against the job's plan (worker_reports.h; rank 0's
// steps and epochs are the job's, every rank's throughput and allreduce time go to the
// observers), records the checkpoints rank 0 hands over when the run would write them and they
// are the job's model's, passes on cancel, shutdown and "checkpoint now", and ends the attempt
// at the first failure of any rank, or its silence past the heartbeat: the other workers are
// stopped (SIGTERM, then SIGKILL), never left to hang.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kiln/v1/worker.pb.h"
#include "server/datasets/dataset_catalog.h"
#include "server/jobs/job_events.h"
#include "server/jobs/job_slot.h"
#include "server/jobs/job_store.h"
#include "server/jobs/worker_attempt.h"
#include "server/jobs/worker_reports.h"

namespace kiln::server {

struct WorkerRunnerOptions {
  std::string state_dir;  // checkpoints and the workers' logs go under it
  std::string data_dir;   // handed to local workers, which read the dataset from it
  // The kiln-worker executable kilnd starts for local workers, and arguments they all get
  // after their own (TLS to kilnd).
  std::string worker_binary;
  std::vector<std::string> worker_args;
  // Non-empty: why this kilnd cannot start local workers (its TLS needs worker flags it was not
  // given); Submit refuses such jobs with it.
  std::string local_workers_refusal;
  WorkerRegistry* registry = nullptr;
  // Local workers that have not all joined by then fail the attempt; external ones get longer
  // (their pods may be scheduled and pulled first).
  absl::Duration join_timeout = absl::Seconds(60);
  absl::Duration external_join_timeout = absl::Minutes(10);
  // How long a collective waits for a peer (JoinJobResponse.collective_timeout_ms).
  absl::Duration collective_timeout = absl::Seconds(60);
  // A rank that joined and sends no report and no keep-alive for this long fails the attempt.
  absl::Duration heartbeat_timeout = absl::Minutes(1);
  // After cancel or shutdown is passed on: how long the workers get to checkpoint and stop.
  absl::Duration stop_grace = absl::Seconds(60);
  // CPU threads the job's local workers share (each takes its part); 0: the machine's cores.
  int cpu_threads = 0;
  absl::Duration step_delay = absl::ZeroDuration();  // tests only
};

class WorkerJobRunner {
 public:
  // Not owned; each must outlive Run. `devices`: one per rank ("cpu" or "cuda:N"). `datasets`
  // tells the steps of an epoch the workers' reports must agree with.
  WorkerJobRunner(JobSlot* slot, std::mutex* mu, JobStore* store, JobEvents* events,
                  const DatasetCatalog* datasets, std::vector<std::string> devices,
                  const WorkerRunnerOptions& options)
      : slot_(slot),
        mu_(mu),
        store_(store),
        events_(events),
        datasets_(datasets),
        devices_(std::move(devices)),
        options_(options) {}

  // Runs the attempt: OK when every rank reached the job's epochs and rank 0's final checkpoint
  // is recorded; else why it ended (Cancelled, Aborted for a shutdown, or the failure).
  absl::Status Run();

 private:
  struct Worker {
    int rank = 0;
    pid_t pid = -1;
    std::string log_path;
    bool reaped = false;
  };

  // The newest checkpoint that verifies (or the one ResumeJob named); id 0 for none.
  absl::StatusOr<v1::Checkpoint> ChooseStart();
  // What the attempt starting from `start` trains, as its workers' reports must agree.
  absl::StatusOr<WorkerPlan> Plan(const v1::Checkpoint& start);
  // Checks a report against the plan (WorkerReportCheck), then records it.
  absl::Status OnReport(int rank, const v1::WorkerReport& report);
  // Whether the run would write a checkpoint of the header's kind at its position now, and the
  // most bytes its file may have.
  absl::StatusOr<int64_t> AdmitCheckpoint(const v1::WriteCheckpointHeader& header);
  absl::Status AdmitCheckpointLocked(const v1::WriteCheckpointHeader& header);
  // Checks the file is a checkpoint of the job's model at the header's position, then records it.
  absl::StatusOr<v1::Checkpoint> OnCheckpoint(const v1::WriteCheckpointHeader& header,
                                              const std::string& path);
  absl::Status StartLocalWorkers(const std::string& coordinator, const std::string& token,
                                 int attempt);
  // A local worker that exited, as a failure naming it (OK while all run or exited cleanly).
  absl::Status ReapExited(const WorkerAttempt::Snapshot& state);
  void StopWorkers();
  // DeadlineExceeded naming the ranks that joined and were not heard from for the heartbeat
  // timeout.
  absl::Status CheckHeartbeats(const WorkerAttempt::Snapshot& state, absl::Time now) const;
  // Waits for the attempt to end as the ranks and the slot's flags say.
  absl::Status Supervise(WorkerAttempt& attempt, bool external);

  JobSlot* slot_;
  std::mutex* mu_;
  JobStore* store_;
  JobEvents* events_;
  const DatasetCatalog* datasets_;
  const std::vector<std::string> devices_;
  const WorkerRunnerOptions& options_;
  std::vector<Worker> workers_;
  // Guarded by mu_: each rank's samples a second over its latest step.
  std::vector<double> rank_rates_;
  std::optional<WorkerReportCheck> check_;  // guarded by mu_
  int epochs_ = 0;
  WorkerPlan plan_;                    // set before the attempt opens
  std::optional<TrainConfig> config_;  // the job's, set before the attempt opens
  // What rank 0 was asked for (Supervise's commands), so that a checkpoint of a kind the run
  // writes only when asked is taken only when it was.
  std::atomic<int> on_demand_asked_{0};
  std::atomic<bool> stop_sent_{false}, cancel_sent_{false};
  // The checkpoints this attempt recorded (guarded by mu_): each kind as often as a run writes
  // it, at a position never behind the last.
  struct Recorded {
    int64_t global_step = 0;
    int epochs_done = 0;
    std::set<int> periodic_epochs, best_epochs;
    int on_demand = 0;
    bool final = false, shutdown = false, cancel = false;
  } recorded_;
};

}  // namespace kiln::server
