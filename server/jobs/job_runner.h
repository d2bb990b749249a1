// One training attempt of one job in kilnd's process: builds the backend and the trainer, resumes
// from the job's latest checkpoint, and drives the training run (training_run.h), turning its
// step and epoch events into job events and writing the checkpoints it decides on. It reports
// through the store, JobEvents and the job's slot alone; it never calls back into the job manager.
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
#include "server/datasets/dataset_catalog.h"
#include "server/jobs/job_events.h"
#include "server/jobs/job_slot.h"
#include "server/jobs/job_store.h"
#include "server/jobs/spec_translation.h"
#include "server/jobs/training_run.h"

namespace kiln {
class Trainer;
}

namespace kiln::server {

struct JobRunnerOptions {
  std::string state_dir;  // checkpoints go to state_dir/checkpoints/<job>/
  SpecLimits limits;
  int max_jobs_per_device = 1;  // a CPU job takes this share of the cores
  // For tests only: a pause after every training step, to make jobs last predictably.
  absl::Duration step_delay = absl::ZeroDuration();
};

class JobRunner : private TrainingRunHost {
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
  // Loads the newest checkpoint that verifies and loads (or the one ResumeJob named) into
  // `trainer`, recording on the job where it resumed and what it passed over.
  absl::Status Resume(Trainer& trainer);
  // Writes, records and announces a checkpoint of `kind`, then prunes what it makes redundant.
  absl::StatusOr<v1::Checkpoint> SaveCheckpoint(Trainer& trainer, v1::CheckpointKind kind);

  // TrainingRunHost: events go to the store and the job's watchers, commands come from the
  // slot's flags, and an on-demand checkpoint's result goes to those who asked for it.
  absl::Status OnStep(const StepEvent& step, int64_t samples, double seconds) override;
  absl::Status OnEpoch(const EpochEvent& epoch, bool improved, double best) override;
  absl::StatusOr<RunCommands> Commands(Trainer& trainer) override;
  absl::Status WriteCheckpoint(Trainer& trainer, v1::CheckpointKind kind) override;
  void CheckpointFailed(v1::CheckpointKind, const absl::Status&) override {}
  bool HasCheckpointAt(int64_t global_step) override;

  JobSlot* slot_;
  std::mutex* mu_;
  JobStore* store_;
  JobEvents* events_;
  const DatasetCatalog* datasets_;
  const JobRunnerOptions options_;
  int epochs_ = 0;  // the job's epochs, for its epoch events
};

}  // namespace kiln::server
