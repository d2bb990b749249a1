#include "server/observability/job_observers.h"

#include "server/jobs/job_vocabulary.h"

namespace kiln::server {

void JobMetricsObserver::OnRecovered(const v1::Job& job) {
  metrics_->JobStateChanged(job.id(), v1::JOB_STATE_UNSPECIFIED, job.state());
  metrics_->JobQueueChanged(job, v1::JOB_STATE_UNSPECIFIED);
}

void JobMetricsObserver::OnSubmitted(const v1::Job&) { metrics_->JobSubmitted(); }

void JobMetricsObserver::OnStateChanged(const v1::Job& job, v1::JobState from) {
  metrics_->JobStateChanged(job.id(), from, job.state());
  metrics_->JobQueueChanged(job, from);
}

void JobMetricsObserver::OnTrainingStarted(const std::string& job_id, const v1::JobSpec& spec,
                                           int epochs) {
  metrics_->TrainingStarted(job_id, ModelLabel(spec), epochs);
}

void JobMetricsObserver::OnStep(const std::string& job_id, const StepEvent& step, int64_t samples,
                                double seconds) {
  metrics_->TrainingStep(job_id, step, samples, seconds);
}

void JobMetricsObserver::OnWorkerStep(const std::string& job_id, int rank, int world_size,
                                      double samples_per_sec, double allreduce_seconds,
                                      int64_t allreduce_bytes) {
  metrics_->WorkerStep(job_id, rank, world_size, samples_per_sec, allreduce_seconds,
                       allreduce_bytes);
}

void JobMetricsObserver::OnEpoch(const std::string& job_id, const EpochEvent& epoch, int) {
  metrics_->TrainingEpoch(job_id, epoch);
}

void JobMetricsObserver::OnCheckpoint(const v1::Checkpoint& c, double seconds) {
  metrics_->CheckpointWritten(c.job_id(), CheckpointKindName(c.kind()), seconds, c.size_bytes());
}

void JobLogObserver::OnSubmitted(const v1::Job& job) { log_->JobSubmitted(job); }

void JobLogObserver::OnStateChanged(const v1::Job& job, v1::JobState from) {
  log_->JobStateChanged(job, from);
}

void JobLogObserver::OnEpoch(const std::string& job_id, const EpochEvent& epoch, int epochs) {
  log_->EpochDone(job_id, epoch, epochs);
}

void JobLogObserver::OnCheckpoint(const v1::Checkpoint& c, double seconds) {
  log_->CheckpointWritten(c, seconds);
}

}  // namespace kiln::server
