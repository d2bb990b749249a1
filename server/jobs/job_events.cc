#include "server/jobs/job_events.h"

#include <utility>

#include "common/status_macros.h"
#include "engine/trainer.h"
#include "server/jobs/event_messages.h"
#include "server/jobs/proto_time.h"

namespace kiln::server {

JobEvents::JobEvents(JobStore* store, MetricBroadcaster* broadcaster,
                     std::vector<JobEventObserver*> observers)
    : store_(store), broadcaster_(broadcaster), observers_(std::move(observers)) {}

std::shared_ptr<Subscription> JobEvents::Subscribe(const std::string& job_id, bool include_steps) {
  return broadcaster_->Subscribe(job_id, include_steps);
}

void JobEvents::Unsubscribe(const std::shared_ptr<Subscription>& subscription) {
  broadcaster_->Unsubscribe(subscription);
}

void JobEvents::Recovered(const v1::Job& job) {
  for (JobEventObserver* observer : observers_) observer->OnRecovered(job);
}

void JobEvents::Submitted(const v1::Job& job) {
  for (JobEventObserver* observer : observers_) observer->OnSubmitted(job);
}

void JobEvents::TrainingStarted(const std::string& job_id, const v1::JobSpec& spec, int epochs) {
  for (JobEventObserver* observer : observers_) observer->OnTrainingStarted(job_id, spec, epochs);
}

absl::Status JobEvents::Emit(const v1::Job& job, v1::JobEvent event, Persist persist,
                             int64_t* next_seq) {
  event.set_seq(*next_seq);
  *event.mutable_time() = MillisToTimestamp(NowMillis());
  KILN_RETURN_IF_ERROR(persist == Persist::kJobAndEvent ? store_->PutJob(job, &event)
                                                        : store_->AppendEvent(job.id(), event));
  ++*next_seq;
  broadcaster_->Publish(job.id(), event);
  return absl::OkStatus();
}

absl::Status JobEvents::StateChanged(const v1::Job& job, v1::JobState from, int64_t* next_seq) {
  v1::JobEvent event;
  event.mutable_state()->set_state(job.state());
  event.mutable_state()->set_reason(job.reason());
  // Not recorded, not announced: the job is still in its recorded state.
  KILN_RETURN_IF_ERROR(Emit(job, std::move(event), Persist::kJobAndEvent, next_seq));
  for (JobEventObserver* observer : observers_) observer->OnStateChanged(job, from);
  if (IsFinal(job.state())) broadcaster_->Close(job.id(), absl::OkStatus());
  return absl::OkStatus();
}

absl::Status JobEvents::Step(const v1::Job& job, const StepEvent& e, int64_t samples,
                             double seconds, int64_t* next_seq,
                             const std::vector<double>* rank_samples_per_sec) {
  v1::JobEvent event;
  v1::StepMetrics* m = event.mutable_step();
  *m = StepMetricsOf(e);
  if (rank_samples_per_sec != nullptr) {
    m->mutable_rank_samples_per_sec()->Add(rank_samples_per_sec->begin(),
                                           rank_samples_per_sec->end());
  }
  absl::Status status = Emit(job, std::move(event), Persist::kEventOnly, next_seq);
  for (JobEventObserver* observer : observers_) observer->OnStep(job.id(), e, samples, seconds);
  return status;
}

void JobEvents::WorkerStep(const std::string& job_id, int rank, int world_size,
                           double samples_per_sec, double allreduce_seconds,
                           int64_t allreduce_bytes) {
  for (JobEventObserver* observer : observers_) {
    observer->OnWorkerStep(job_id, rank, world_size, samples_per_sec, allreduce_seconds,
                           allreduce_bytes);
  }
}

absl::Status JobEvents::Epoch(const v1::Job& job, const EpochEvent& e, int epochs,
                              int64_t* next_seq) {
  v1::JobEvent event;
  *event.mutable_epoch() = EpochMetricsOf(e);
  absl::Status status = Emit(job, std::move(event), Persist::kJobAndEvent, next_seq);
  for (JobEventObserver* observer : observers_) observer->OnEpoch(job.id(), e, epochs);
  return status;
}

absl::Status JobEvents::CheckpointWritten(const v1::Job& job, const v1::Checkpoint& checkpoint,
                                          double seconds, int64_t* next_seq) {
  v1::JobEvent event;
  *event.mutable_checkpoint() = checkpoint;
  KILN_RETURN_IF_ERROR(Emit(job, std::move(event), Persist::kJobAndEvent, next_seq));
  for (JobEventObserver* observer : observers_) observer->OnCheckpoint(checkpoint, seconds);
  return absl::OkStatus();
}

void JobEvents::Interrupted(const v1::Job& job) {
  store_->PutJob(job).IgnoreError();
  broadcaster_->Close(job.id(), absl::UnavailableError("kilnd is shutting down; the job resumes "
                                                       "when it starts again"));
}

}  // namespace kiln::server
