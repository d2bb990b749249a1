// One rank of a data-parallel job, start to end: join the job at kilnd, open the Report stream,
// load the dataset, meet the peers, train as kilnd's JobRunner trains a single-process job (the
// same spec translation, callbacks, checkpoint policy and final checkpoint), report every step
// and epoch, and say done or failed.
#pragma once

#include <atomic>

#include "absl/status/status.h"
#include "server/worker/worker_flags.h"

namespace kiln::worker {

// Runs the worker; returns once training ended and kilnd was told. `terminate` becomes true on
// SIGTERM: the run then stops at the next step with Aborted. A non-OK status names the rank and
// what went wrong; it has been reported to kilnd as `failed` when the Report stream was open.
absl::Status RunWorker(const WorkerFlags& flags, const std::atomic<bool>& terminate);

}  // namespace kiln::worker
