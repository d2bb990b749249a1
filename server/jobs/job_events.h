// The one way a job's events leave the jobs core. Each is persisted to the store (seq and time
// assigned here), then published to the job's watchers (MetricBroadcaster), then handed to the
// observers (job_event_observer.h) in their order: what a watcher or an observer sees is durable.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kiln/v1/training.pb.h"
#include "server/jobs/job_event_observer.h"
#include "server/jobs/job_store.h"
#include "server/jobs/job_vocabulary.h"
#include "server/jobs/metric_broadcaster.h"

namespace kiln::server {

// Thread-safe as far as the store, the broadcaster and the observers are; callers serialise the
// events of one job (the job manager holds its lock), since `next_seq` orders them.
class JobEvents {
 public:
  // Not owned; each must outlive this.
  JobEvents(JobStore* store, MetricBroadcaster* broadcaster,
            std::vector<JobEventObserver*> observers);

  // The job's live events, for WatchJob (see MetricBroadcaster).
  std::shared_ptr<Subscription> Subscribe(const std::string& job_id, bool include_steps);
  void Unsubscribe(const std::shared_ptr<Subscription>& subscription);

  // Nothing to persist or publish: the observers only.
  void Recovered(const v1::Job& job);
  void Submitted(const v1::Job& job);
  void TrainingStarted(const std::string& job_id, const v1::JobSpec& spec, int epochs);

  // Each takes the next of the job's event numbers from `next_seq` once recorded. A store error
  // is returned and the event is not published; the observers hear of a step or an epoch anyway
  // (it happened), but not of a state change or a checkpoint that was not recorded.
  //
  // `job` is in its new state; persisted with a state event. A final state ends the job's live
  // streams. Not recorded, the change did not happen: the caller keeps the job as it was.
  absl::Status StateChanged(const v1::Job& job, v1::JobState from, int64_t* next_seq);
  // A step event alone: the job's step count lives in memory until its next write. A job of
  // several workers adds each rank's samples a second.
  absl::Status Step(const v1::Job& job, const StepEvent& step, int64_t samples, double seconds,
                    int64_t* next_seq, const std::vector<double>* rank_samples_per_sec = nullptr);
  // One rank's step of a job of `world_size` workers: for the observers only (the job's own
  // step event comes from rank 0 through Step).
  void WorkerStep(const std::string& job_id, int rank, int world_size, double samples_per_sec,
                  double allreduce_seconds, int64_t allreduce_bytes);
  // `job` already carries the epoch (epochs_done, last_epoch); persisted with an epoch event.
  absl::Status Epoch(const v1::Job& job, const EpochEvent& epoch, int epochs, int64_t* next_seq);
  // `checkpoint` is already in the store; the job is persisted with a checkpoint event.
  absl::Status CheckpointWritten(const v1::Job& job, const v1::Checkpoint& checkpoint,
                                 double seconds, int64_t* next_seq);
  // The job stopped for a shutdown and stays RUNNING: persisted as it is, and its watchers told
  // that it resumes when kilnd starts again.
  void Interrupted(const v1::Job& job);

 private:
  enum class Persist { kEventOnly, kJobAndEvent };
  absl::Status Emit(const v1::Job& job, v1::JobEvent event, Persist persist, int64_t* next_seq);

  JobStore* store_;
  MetricBroadcaster* broadcaster_;
  const std::vector<JobEventObserver*> observers_;
};

}  // namespace kiln::server
