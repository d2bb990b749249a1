// A job's dataset for a worker without a copy of kilnd's data dir: Workers.ReadDataset into a
// cache folder, every file checked against its sha256, published as a whole folder by one rename
// so that a dataset folder in the cache is always complete.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "server/worker/coordinator_connection.h"

namespace kiln::worker {

// Fetches job `job_id`'s dataset `dataset` into `cache_dir`/`job_id`/`dataset`/ (replacing what
// was there) and returns `cache_dir`/`job_id`, a data dir that holds it. DataLoss naming the
// file whose bytes do not match their digest; InvalidArgument for a file name that is not a
// plain name.
absl::StatusOr<std::string> FetchDataset(CoordinatorConnection& connection,
                                         const std::string& job_id, const std::string& dataset,
                                         const std::string& cache_dir);

}  // namespace kiln::worker
