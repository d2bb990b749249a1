// Model sources for kilnd's deployments: "JOB", "JOB@latest", "JOB@best" or "JOB@<checkpoint id>"
// resolved to one of the job's checkpoint files, its id as the version, and its aliases.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/v1/training.pb.h"
#include "server/serving/model_repository.h"

namespace kiln::serving {

// Lists a job's checkpoints still on disk, oldest first (JobManager::ListCheckpoints).
using CheckpointLister =
    std::function<absl::StatusOr<std::vector<v1::Checkpoint>>(const std::string& job_id)>;

// A resolver for ModelRepositoryOptions::resolver. "JOB" means "JOB@latest"; "best" is the
// checkpoint with the highest test accuracy (the later one on a tie). The chosen checkpoint gets
// the aliases it deserves now: "latest" when it is the newest, "best" when it is the best.
// NotFound naming the job when it has no such checkpoint; the lister's errors as they are.
CheckpointResolver MakeJobCheckpointResolver(CheckpointLister list_checkpoints);

}  // namespace kiln::serving
