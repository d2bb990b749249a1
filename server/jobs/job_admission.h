// What Submit checks before a job is queued, in the order a user fixes things: the spec
// translated within the limits, the worker fields, the dataset it names (there, fitting the
// model, augmentable, no batch-norm batch of one), the device or the workers' devices, and the
// memory the job needs against --max_job_memory_bytes. It reads the dataset catalog and the
// machine's devices and changes nothing; every refusal names the spec's field.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/trainer.h"
#include "kiln/v1/training.pb.h"
#include "server/datasets/dataset_catalog.h"
#include "server/jobs/spec_translation.h"
#include "server/jobs/worker_job_runner.h"

namespace kiln::server {

// A job Submit may queue: its spec as the engine takes it, and the queue (device) it waits in.
struct AdmittedJob {
  TrainConfig config;
  std::string device;
};

class JobAdmission {
 public:
  // Not owned: `datasets` and `workers` must outlive this. `default_device` serves specs that
  // name none; CPU jobs side by side each take 1/`max_jobs_per_device` of the cores.
  JobAdmission(const DatasetCatalog* datasets, const SpecLimits& limits, std::string default_device,
               int max_jobs_per_device, const WorkerRunnerOptions* workers)
      : datasets_(datasets),
        limits_(limits),
        default_device_(std::move(default_device)),
        max_jobs_per_device_(max_jobs_per_device),
        workers_(*workers) {}

  absl::StatusOr<AdmittedJob> Admit(const v1::JobSpec& spec) const;

 private:
  // Resolves "auto" and "" and checks the device exists.
  absl::StatusOr<std::string> ResolveDevice(const std::string& device) const;
  // RESOURCE_EXHAUSTED when the job's memory plan is over --max_job_memory_bytes, naming the
  // need, its largest part (and the layer) and the limit.
  absl::Status CheckJobMemory(const TrainConfig& config, const DatasetInfo& info,
                              const std::string& device) const;
  // Checks a job of several workers' fields (workers, max_retries, device) and resolves its
  // device to the queue it waits in: "cpu" or "cuda" (any free GPUs, gang-scheduled).
  absl::StatusOr<std::string> CheckWorkers(const v1::JobSpec& spec, const TrainConfig& config,
                                           const DatasetInfo& info) const;

  const DatasetCatalog* datasets_;
  const SpecLimits limits_;
  const std::string default_device_;
  const int max_jobs_per_device_;
  const WorkerRunnerOptions& workers_;
};

}  // namespace kiln::server
