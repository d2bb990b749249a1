// Records a checkpoint file a job's run wrote as the job's own: its digest and size, a row in
// the store, a checkpoint event, and the pruning of what the job's policy then makes redundant.
// The in-process runner (job_runner.h) and the runner of a job's workers (worker_job_runner.h),
// whose rank 0 hands its files over the Workers service, both record through here.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "kiln/v1/training.pb.h"
#include "server/jobs/job_events.h"
#include "server/jobs/job_slot.h"
#include "server/jobs/job_store.h"

namespace kiln::server {

// Where a run of `job_id` writes a checkpoint of `kind` at `global_step` (the folder is made).
std::string NewCheckpointPath(const std::string& state_dir, const std::string& job_id,
                              v1::CheckpointKind kind, int64_t global_step);

struct CheckpointFacts {
  v1::CheckpointKind kind = v1::CHECKPOINT_KIND_UNSPECIFIED;
  int32_t epochs_done = 0;
  int64_t global_step = 0;
  double write_seconds = 0;
};

// `path` holds the written checkpoint. Takes `mu` (the slot's guard). A job resumed from a
// named checkpoint follows its own from now on (resume_checkpoint_id cleared).
absl::StatusOr<v1::Checkpoint> RecordCheckpoint(JobSlot* slot, std::mutex* mu, JobStore* store,
                                                JobEvents* events, const std::string& path,
                                                const CheckpointFacts& facts);

}  // namespace kiln::server
