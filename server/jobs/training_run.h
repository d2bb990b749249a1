// One training run's rules, written once and driven both by kilnd's in-process runner
// (job_runner.h) and by each rank of a job of several workers (server/worker/worker_run.cc): how
// many samples a step took and how long, whether an epoch improved on the best, and which
// checkpoints are written when (after an epoch, on demand, when stopped or cancelled, at the
// end). What differs between the two (where events go, how a checkpoint is written, how commands
// arrive) is the caller's TrainingRunHost.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/trainer.h"
#include "kiln/v1/training.pb.h"
#include "server/checkpoints/checkpoint_policy.h"

namespace kiln::server {

// The samples step `step_in_epoch` (1-based) of an epoch over `train_size` samples took: a full
// batch, or what is left for the epoch's last.
int64_t StepSamples(int batch_size, int64_t train_size, int step_in_epoch);

// The best epoch score so far and the rule for "improved": the test accuracy where the job has a
// test split, else the training accuracy; the first epoch always improves, so that a job keeping
// its best checkpoint has one. kilnd keeps the best as Job.best_test_accuracy.
class BestEpoch {
 public:
  explicit BestEpoch(double best_so_far) : best_(best_so_far) {}
  // Whether `epoch` improves on the best; if it does, its score becomes the best.
  bool Observe(const EpochEvent& epoch);
  double best() const { return best_; }

 private:
  double best_;
};

// What a run is asked to do at the end of a step.
struct RunCommands {
  bool checkpoint = false;  // write an on-demand checkpoint, then go on
  bool stop = false;        // kilnd is shutting down: keep where the run got to, stop
  bool cancel = false;      // the job was cancelled: the same, as a cancel
  // A higher-priority job wants the device: a checkpoint whatever the policy (the job resumes
  // from it), then stop.
  bool preempt = false;
};

// What differs between the callers of a TrainingRun. Called on the training thread.
class TrainingRunHost {
 public:
  virtual ~TrainingRunHost() = default;

  // A step ended: `samples` (StepSamples) in `seconds` since the previous step's end. An error
  // stops the run at the step's end.
  virtual absl::Status OnStep(const StepEvent& step, int64_t samples, double seconds) = 0;
  // An epoch ended; `best` is the best score after it (BestEpoch). An error stops the run.
  virtual absl::Status OnEpoch(const EpochEvent& epoch, bool improved, double best) = 0;
  // At every step's end, before anything is written: what the run is asked to do. All ranks of
  // a job must get the same answer (the worker agrees on it with its peers). An error stops the
  // run at once, writing nothing.
  virtual absl::StatusOr<RunCommands> Commands(Trainer& trainer) = 0;
  // Writes a checkpoint of `kind` of the trainer's model and position, and records it.
  virtual absl::Status WriteCheckpoint(Trainer& trainer, v1::CheckpointKind kind) = 0;
  // A checkpoint the run goes on or stops without failed (on demand, when stopped or cancelled):
  // the host tells whoever should hear of it. `WriteCheckpoint`'s error, as it returned it.
  virtual void CheckpointFailed(v1::CheckpointKind kind, const absl::Status& error) = 0;
  // Whether a checkpoint of the job at `global_step` exists: the end writes none then.
  virtual bool HasCheckpointAt(int64_t global_step) = 0;
  // Stopped or cancelled, after the last checkpoint: what must happen before the run returns
  // (the ranks wait for rank 0's checkpoint to be stored).
  virtual absl::Status BeforeStopping() { return absl::OkStatus(); }
  // A new step's clock starts (the worker starts its allreduce totals afresh).
  virtual void StepClockRestarted() {}
};

class TrainingRun {
 public:
  // Not owned; each must outlive the run. `best_so_far`: the job's best epoch score (0 for a new
  // job). `train_size`: the samples of the training split.
  TrainingRun(const CheckpointPolicy& policy, int batch_size, int64_t train_size,
              double best_so_far, TrainingRunHost* host)
      : policy_(policy),
        batch_size_(batch_size),
        train_size_(train_size),
        best_(best_so_far),
        host_(host) {}

  // Trains `trainer` from its position to its configured end. OK when it got there and a
  // checkpoint of the finished model exists; else why it stopped: Aborted for a shutdown,
  // Cancelled for a cancel, or the failure. `cancel` (may be null) is handed to the trainer,
  // which then stops before the next step; the cancel command still decides the checkpoint.
  absl::Status Run(Trainer& trainer, const std::atomic<bool>* cancel = nullptr);

 private:
  Trainer::Callbacks MakeCallbacks();
  absl::Status AfterStep(Trainer& trainer);
  // The checkpoint of a run that stops anyway (stop, cancel): a failure is only told.
  void WriteLastCheckpoint(Trainer& trainer, v1::CheckpointKind kind);

  const CheckpointPolicy& policy_;
  const int batch_size_;
  const int64_t train_size_;
  BestEpoch best_;
  TrainingRunHost* host_;
  absl::Status host_error_;  // from the step and epoch callbacks, which cannot return one
  absl::Time step_start_;
  int epoch_ended_ = 0;  // the epoch that ended at this step, or 0
  bool improved_ = false;
};

}  // namespace kiln::server
