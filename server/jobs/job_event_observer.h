// What the jobs core tells the rest of kilnd (metrics, the event log) about its jobs, through
// one interface registered once by the composition root: the core names no sink. JobEvents
// (job_events.h) calls the observers after an event is persisted and published to watchers.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/v1/training.pb.h"

namespace kiln {
struct EpochEvent;
struct StepEvent;
}  // namespace kiln

namespace kiln::server {

// Every method has a default that ignores the event. Called on the thread of the event, often
// with the job manager's lock held: must be quick, thread-safe, and never call the manager.
class JobEventObserver {
 public:
  virtual ~JobEventObserver() = default;

  // A job loaded from the store at start, in its stored state (before any change Recover makes).
  virtual void OnRecovered(const v1::Job& /*job*/) {}
  // A new job was accepted; it is QUEUED (OnStateChanged from UNSPECIFIED came first).
  virtual void OnSubmitted(const v1::Job& /*job*/) {}
  // `job` moved from `from` (UNSPECIFIED for a new job) to job.state().
  virtual void OnStateChanged(const v1::Job& /*job*/, v1::JobState /*from*/) {}
  // A run of the job begins, after it resumed from its latest checkpoint, for `epochs` in all.
  virtual void OnTrainingStarted(const std::string& /*job_id*/, const v1::JobSpec& /*spec*/,
                                 int /*epochs*/) {}
  // One optimizer step of `samples` samples took `seconds`.
  virtual void OnStep(const std::string& /*job_id*/, const StepEvent& /*step*/, int64_t /*samples*/,
                      double /*seconds*/) {}
  // Rank `rank` of a job of `world_size` workers stepped at `samples_per_sec` (its own slices),
  // its gradient allreduce taking `allreduce_seconds` over `allreduce_bytes`.
  virtual void OnWorkerStep(const std::string& /*job_id*/, int /*rank*/, int /*world_size*/,
                            double /*samples_per_sec*/, double /*allreduce_seconds*/,
                            int64_t /*allreduce_bytes*/) {}
  // An epoch of a run of `epochs` ended (with its evaluation).
  virtual void OnEpoch(const std::string& /*job_id*/, const EpochEvent& /*epoch*/, int /*epochs*/) {
  }
  // A checkpoint was written in `seconds` and recorded.
  virtual void OnCheckpoint(const v1::Checkpoint& /*checkpoint*/, double /*seconds*/) {}
};

}  // namespace kiln::server
