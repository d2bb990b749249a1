// One training attempt of one job: builds the backend and the trainer, resumes from the job's
// latest checkpoint, trains to the job's epochs, turns the engine's step and epoch events into
// job events, and writes checkpoints as the job's policy and requests ask. It reports through
// the store, JobEvents and the job's slot alone; it never calls back into the job manager.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kiln/v1/training.pb.h"
#include "server/jobs/dataset_catalog.h"
#include "server/jobs/job_events.h"
#include "server/jobs/job_store.h"
#include "server/jobs/spec_translation.h"

namespace kiln {
class Trainer;
}

namespace kiln::server {

using CheckpointDone = std::function<void(absl::StatusOr<v1::Checkpoint>)>;

// One job as the job manager and the attempt running it share it. The fields marked guarded are
// guarded by the manager's mutex, which the runner is handed for them.
struct JobSlot {
  v1::Job job;  // guarded; the store holds the same, less live step progress
  // The job's spec as the engine takes it, translated once (at Submit, or at Recover after a
  // restart) and fixed from then on.
  std::optional<TrainConfig> config;
  int64_t next_seq = 1;  // guarded
  std::atomic<bool> cancel{false};
  std::atomic<bool> stop{false};  // daemon shutdown: checkpoint and stop, stay RUNNING
  std::atomic<bool> checkpoint_wanted{false};
  std::vector<CheckpointDone> checkpoint_waiters;  // guarded
  // A state change the store refused (a full disk): the job keeps its recorded state, in memory
  // as in the store, until the change is recorded (JobManager retries it). Guarded.
  std::optional<std::pair<v1::JobState, std::string>> unrecorded_state;
  std::thread thread;  // the running attempt, if any
  // The devices the running attempt holds a slot of (guarded): the job's device, or a gang
  // job's GPUs.
  std::vector<std::string> devices;
};

// Whether a job runs as kiln-worker processes (several workers, or workers started elsewhere)
// rather than in kilnd's process.
inline bool RunsAsWorkers(const v1::JobSpec& spec) {
  return spec.workers() > 1 || spec.external_workers();
}

struct JobRunnerOptions {
  std::string state_dir;  // checkpoints go to state_dir/checkpoints/<job>/
  SpecLimits limits;
  int max_jobs_per_device = 1;  // a CPU job takes this share of the cores
  // For tests only: a pause after every training step, to make jobs last predictably.
  absl::Duration step_delay = absl::ZeroDuration();
};

class JobRunner {
 public:
  // Not owned but `options`; each must outlive Run. `mu` guards the slot's guarded fields.
  JobRunner(JobSlot* slot, std::mutex* mu, JobStore* store, JobEvents* events,
            const DatasetCatalog* datasets, const JobRunnerOptions& options)
      : slot_(slot),
        mu_(mu),
        store_(store),
        events_(events),
        datasets_(datasets),
        options_(options) {}

  // Trains the job; OK when it reached its epochs (with a checkpoint of the final model), else
  // why it stopped (cancelled, shut down, failed). Its status decides the job's final state.
  absl::Status Run();

 private:
  // Writes, records and announces a checkpoint of `kind`, then prunes what it makes redundant.
  absl::StatusOr<v1::Checkpoint> SaveCheckpoint(Trainer& trainer, v1::CheckpointKind kind);

  JobSlot* slot_;
  std::mutex* mu_;
  JobStore* store_;
  JobEvents* events_;
  const DatasetCatalog* datasets_;
  const JobRunnerOptions options_;
};

}  // namespace kiln::server
