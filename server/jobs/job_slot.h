// One job as the job manager and the attempt running it share it (JobSlot), and the rule for
// whether a job runs in kilnd's process or as kiln-worker processes.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/trainer.h"
#include "kiln/v1/training.pb.h"

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
  // A higher-priority job (preempted_by, guarded) wants the device: checkpoint, stop, and queue
  // again, to resume from that checkpoint.
  std::atomic<bool> preempt{false};
  std::string preempted_by;
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

// Whether a job is a gang: device "cuda" with kilnd's own workers, one per GPU, all of them
// started at once on free GPUs (an external worker's GPU is on its own machine).
inline bool IsGang(const v1::Job& job) {
  return job.device() == "cuda" && !job.spec().external_workers();
}

}  // namespace kiln::server
