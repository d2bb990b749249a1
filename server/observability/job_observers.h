// The jobs core's events (server/jobs/job_event_observer.h) into kilnd's metric families and its
// event log; the composition root registers one of each with the job manager.
#pragma once

#include <cstdint>
#include <string>

#include "server/jobs/job_event_observer.h"
#include "server/observability/logging.h"
#include "server/observability/metrics.h"

namespace kiln::server {

// Job counts by state, submissions and completions, and the per-job training series.
class JobMetricsObserver final : public JobEventObserver {
 public:
  explicit JobMetricsObserver(Metrics* metrics) : metrics_(metrics) {}  // not owned

  void OnRecovered(const v1::Job& job) override;
  void OnSubmitted(const v1::Job& job) override;
  void OnStateChanged(const v1::Job& job, v1::JobState from) override;
  void OnTrainingStarted(const std::string& job_id, const v1::JobSpec& spec, int epochs) override;
  void OnStep(const std::string& job_id, const StepEvent& step, int64_t samples,
              double seconds) override;
  void OnWorkerStep(const std::string& job_id, int rank, int world_size, double samples_per_sec,
                    double allreduce_seconds, int64_t allreduce_bytes) override;
  void OnEpoch(const std::string& job_id, const EpochEvent& epoch, int epochs) override;
  void OnCheckpoint(const v1::Checkpoint& checkpoint, double seconds) override;

 private:
  Metrics* metrics_;
};

// One event line per submission, state change, epoch and checkpoint (not per step).
class JobLogObserver final : public JobEventObserver {
 public:
  explicit JobLogObserver(EventLog* log) : log_(log) {}  // not owned

  void OnSubmitted(const v1::Job& job) override;
  void OnStateChanged(const v1::Job& job, v1::JobState from) override;
  void OnEpoch(const std::string& job_id, const EpochEvent& epoch, int epochs) override;
  void OnCheckpoint(const v1::Checkpoint& checkpoint, double seconds) override;

 private:
  EventLog* log_;
};

}  // namespace kiln::server
