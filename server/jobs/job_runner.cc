#include "server/jobs/job_runner.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/shown_paths.h"
#include "common/status_macros.h"
#include "engine/backend_registry.h"
#include "engine/trainer.h"
#include "server/checkpoints/checkpoint_integrity.h"
#include "server/checkpoints/checkpoint_policy.h"
#include "server/jobs/checkpoint_record.h"
#include "server/jobs/event_messages.h"
#include "server/jobs/job_data.h"
#include "server/jobs/job_vocabulary.h"
#include "server/jobs/proto_time.h"

namespace kiln::server {

absl::StatusOr<v1::Checkpoint> JobRunner::SaveCheckpoint(Trainer& trainer,
                                                         v1::CheckpointKind kind) {
  const TrainingPosition& position = trainer.position();
  const std::string path =
      NewCheckpointPath(options_.state_dir, slot_->job.id(), kind, position.global_step);
  const absl::Time write_start = absl::Now();
  KILN_RETURN_IF_ERROR(trainer.SaveCheckpoint(path));
  return RecordCheckpoint(slot_, mu_, store_, events_, path,
                          {kind, position.epochs_done, position.global_step,
                           absl::ToDoubleSeconds(absl::Now() - write_start)});
}

absl::Status JobRunner::Resume(Trainer& trainer) {
  std::string job_id;
  int64_t pinned_checkpoint = 0;  // ResumeJob named it
  {
    std::lock_guard<std::mutex> lock(*mu_);
    job_id = slot_->job.id();
    pinned_checkpoint = slot_->job.resume_checkpoint_id();
  }
  // Continue from the newest checkpoint written that verifies and loads; a damaged one (its
  // digest differs, the file is truncated) is passed over for the next, and the job says so.
  // Newest written, not most advanced: after a resume from an older checkpoint, the run's own
  // checkpoints are the line it follows. A checkpoint ResumeJob named is the only candidate.
  KILN_ASSIGN_OR_RETURN(std::vector<v1::Checkpoint> checkpoints, store_->Checkpoints(job_id));
  std::reverse(checkpoints.begin(), checkpoints.end());  // the store lists them by id, oldest first
  if (pinned_checkpoint != 0) {
    std::erase_if(checkpoints,
                  [&](const v1::Checkpoint& c) { return c.id() != pinned_checkpoint; });
    if (checkpoints.empty()) {
      return absl::NotFoundError(absl::StrCat("checkpoint ", pinned_checkpoint,
                                              ", which the job was resumed from, was deleted"));
    }
  }
  std::string passed_over;  // why newer checkpoints were not used
  absl::Status first_error;
  bool resumed = checkpoints.empty();
  for (const v1::Checkpoint& c : checkpoints) {
    absl::Status loaded = VerifyCheckpointFile(c);
    if (loaded.ok()) loaded = trainer.LoadCheckpoint(c.path());
    if (loaded.ok()) {
      resumed = true;
      if (!passed_over.empty()) {
        passed_over = absl::StrCat("resumed from checkpoint ", c.id(), " (step ", c.global_step(),
                                   "), passing over ", passed_over);
      }
      break;
    }
    if (first_error.ok()) {
      first_error = absl::Status(
          loaded.code(), absl::StrCat("resuming from checkpoint ", c.id(), ": ", loaded.message()));
    }
    absl::StrAppend(&passed_over, passed_over.empty() ? "" : "; ", "checkpoint ", c.id(), ": ",
                    loaded.message());
  }
  if (!resumed) return first_error;
  std::lock_guard<std::mutex> lock(*mu_);
  if (!passed_over.empty()) slot_->job.set_reason(WithShownPaths(passed_over));
  slot_->job.set_resumed_from_step(trainer.position().global_step);
  slot_->job.set_global_step(trainer.position().global_step);
  slot_->job.set_epochs_done(trainer.position().epochs_done);
  return store_->PutJob(slot_->job);
}

absl::Status JobRunner::Run() {
  v1::JobSpec spec;
  std::string job_id, device;
  double best_so_far = 0;
  {
    std::lock_guard<std::mutex> lock(*mu_);
    spec = slot_->job.spec();
    job_id = slot_->job.id();
    device = slot_->job.device();
    best_so_far = slot_->job.best_test_accuracy();
  }
  if (!slot_->config.has_value()) {
    return absl::InternalError(absl::StrCat("job ", job_id, " has no translated spec"));
  }
  const TrainConfig& config = *slot_->config;
  epochs_ = config.epochs;
  const CheckpointPolicy policy(spec.checkpoint_policy());
  KILN_ASSIGN_OR_RETURN(JobData data, LoadJobData(*datasets_, spec.dataset(), config));
  // Jobs running side by side on a device share it: on the CPU each takes its share of the
  // cores, so their thread teams never oversubscribe them (spin-waiting OpenMP teams slow down
  // many times over when they do).
  BackendOptions backend_options;
  backend_options.shares = std::max(1, options_.max_jobs_per_device);
  backend_options.precision = config.precision;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend(device, backend_options));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                        CreateJobTrainer(config, backend.get(), data));
  KILN_RETURN_IF_ERROR(Resume(*trainer));
  if (slot_->stop) return absl::AbortedError("kilnd is shutting down");
  if (slot_->preempt) return absl::AbortedError("preempted before its first step");
  events_->TrainingStarted(job_id, spec, epochs_);

  TrainingRun run(policy, config.batch_size, data.TrainSize(), best_so_far, this);
  return run.Run(*trainer, &slot_->cancel);
}

absl::Status JobRunner::OnStep(const StepEvent& e, int64_t samples, double seconds) {
  absl::Status s;
  {
    std::lock_guard<std::mutex> lock(*mu_);
    slot_->job.set_global_step(e.global_step);
    s = events_->Step(slot_->job, e, samples, seconds, &slot_->next_seq);
  }
  if (options_.step_delay > absl::ZeroDuration()) absl::SleepFor(options_.step_delay);
  return s;
}

absl::Status JobRunner::OnEpoch(const EpochEvent& e, bool improved, double best) {
  std::lock_guard<std::mutex> lock(*mu_);
  if (improved) slot_->job.set_best_test_accuracy(best);
  slot_->job.set_epochs_done(e.epoch);
  *slot_->job.mutable_last_epoch() = EpochMetricsOf(e);
  return events_->Epoch(slot_->job, e, epochs_, &slot_->next_seq);
}

absl::StatusOr<RunCommands> JobRunner::Commands(Trainer&) {
  RunCommands commands;
  commands.checkpoint = slot_->checkpoint_wanted.exchange(false);
  commands.stop = slot_->stop.load();
  commands.cancel = slot_->cancel.load();
  commands.preempt = slot_->preempt.load();
  return commands;
}

absl::Status JobRunner::WriteCheckpoint(Trainer& trainer, v1::CheckpointKind kind) {
  if (kind != v1::CHECKPOINT_KIND_ON_DEMAND) return SaveCheckpoint(trainer, kind).status();
  // Those who asked hear how it went, whichever way.
  std::vector<CheckpointDone> waiters;
  {
    std::lock_guard<std::mutex> lock(*mu_);
    waiters.swap(slot_->checkpoint_waiters);
  }
  absl::StatusOr<v1::Checkpoint> c = SaveCheckpoint(trainer, kind);
  for (CheckpointDone& done : waiters) done(c);
  return c.status();
}

bool JobRunner::HasCheckpointAt(int64_t global_step) {
  absl::StatusOr<std::vector<v1::Checkpoint>> checkpoints = store_->Checkpoints(slot_->job.id());
  if (!checkpoints.ok()) return false;  // writing one more is the safe side
  return std::any_of(checkpoints->begin(), checkpoints->end(),
                     [&](const v1::Checkpoint& c) { return c.global_step() == global_step; });
}

}  // namespace kiln::server
