#include "server/jobs/training_run.h"

#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace kiln::server {
namespace {

absl::Status WithContext(const absl::Status& status, const std::string& what) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
}

}  // namespace

int64_t StepSamples(int batch_size, int64_t train_size, int step_in_epoch) {
  return std::min<int64_t>(batch_size, train_size - int64_t{step_in_epoch - 1} * batch_size);
}

bool BestEpoch::Observe(const EpochEvent& e) {
  const double score = e.test.samples > 0 ? e.test.accuracy : e.train_accuracy;
  const bool improved = best_ < score || e.epoch == 1;
  if (improved) best_ = score;
  return improved;
}

Trainer::Callbacks TrainingRun::MakeCallbacks() {
  Trainer::Callbacks callbacks;
  callbacks.on_step = [this](const StepEvent& e) {
    const double seconds = absl::ToDoubleSeconds(absl::Now() - step_start_);
    absl::Status s =
        host_->OnStep(e, StepSamples(batch_size_, train_size_, e.step_in_epoch), seconds);
    if (!s.ok() && host_error_.ok()) host_error_ = s;
  };
  callbacks.on_epoch = [this](const EpochEvent& e) {
    // Epoch metrics are global, so every rank of a job decides alike.
    improved_ = best_.Observe(e);
    epoch_ended_ = e.epoch;
    absl::Status s = host_->OnEpoch(e, improved_, best_.best());
    if (!s.ok() && host_error_.ok()) host_error_ = s;
  };
  callbacks.after_step = [this](Trainer& t) { return AfterStep(t); };
  return callbacks;
}

void TrainingRun::WriteLastCheckpoint(Trainer& trainer, v1::CheckpointKind kind) {
  if (absl::Status s = host_->WriteCheckpoint(trainer, kind); !s.ok()) {
    host_->CheckpointFailed(kind, s);
  }
}

absl::Status TrainingRun::AfterStep(Trainer& trainer) {
  // Steps are timed from the end of the previous step's decisions (checkpoints included).
  absl::Cleanup next_step = [&] {
    step_start_ = absl::Now();
    host_->StepClockRestarted();
  };
  KILN_RETURN_IF_ERROR(host_error_);
  KILN_ASSIGN_OR_RETURN(const RunCommands commands, host_->Commands(trainer));

  if (epoch_ended_ > 0) {
    const int epoch = std::exchange(epoch_ended_, 0);
    for (v1::CheckpointKind kind : policy_.AfterEpoch(epoch, improved_)) {
      KILN_RETURN_IF_ERROR(WithContext(host_->WriteCheckpoint(trainer, kind),
                                       absl::StrCat("checkpoint after epoch ", epoch)));
    }
  }
  // A failed on-demand checkpoint is told to whoever asked; training goes on.
  if (commands.checkpoint) WriteLastCheckpoint(trainer, v1::CHECKPOINT_KIND_ON_DEMAND);
  // A stopped or cancelled job keeps where it got to, so that a resume loses nothing.
  if (commands.stop || commands.cancel) {
    if (policy_.OnShutdown()) {
      WriteLastCheckpoint(
          trainer, commands.stop ? v1::CHECKPOINT_KIND_SHUTDOWN : v1::CHECKPOINT_KIND_CANCEL);
    }
    KILN_RETURN_IF_ERROR(host_->BeforeStopping());
    if (commands.stop) return absl::AbortedError("kilnd is shutting down");
    return absl::CancelledError(
        absl::StrCat("cancelled at global step ", trainer.position().global_step));
  }
  if (commands.preempt) {
    // Without this checkpoint the requeued job would start over: a failure fails the job.
    KILN_RETURN_IF_ERROR(WithContext(host_->WriteCheckpoint(trainer, v1::CHECKPOINT_KIND_PREEMPTED),
                                     "checkpoint on preemption"));
    KILN_RETURN_IF_ERROR(host_->BeforeStopping());
    return absl::AbortedError(
        absl::StrCat("preempted at global step ", trainer.position().global_step));
  }
  return absl::OkStatus();
}

absl::Status TrainingRun::Run(Trainer& trainer, const std::atomic<bool>* cancel) {
  step_start_ = absl::Now();
  KILN_RETURN_IF_ERROR(trainer.Run(MakeCallbacks(), cancel));
  KILN_RETURN_IF_ERROR(host_error_);
  // Always leave a checkpoint of the finished model, for export and serving.
  const int64_t step = trainer.position().global_step;
  if (!host_->HasCheckpointAt(step)) {
    KILN_RETURN_IF_ERROR(WithContext(host_->WriteCheckpoint(trainer, v1::CHECKPOINT_KIND_FINAL),
                                     "final checkpoint"));
  }
  return absl::OkStatus();
}

}  // namespace kiln::server
