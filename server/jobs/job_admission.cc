#include "server/jobs/job_admission.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/status_macros.h"
#include "engine/backend_registry.h"
#include "engine/data/augment.h"
#include "engine/distributed/data_parallel.h"
#include "engine/memory_plan.h"
#include "engine/model/model.h"
#include "engine/model/sequence_model.h"
#include "server/jobs/job_slot.h"

namespace kiln::server {
namespace {

// Bounds of JobSpec.workers and JobSpec.max_retries.
constexpr int kMaxWorkers = 64;
constexpr int kMaxRetries = 100;

absl::Status CheckWorkerFields(const v1::JobSpec& spec) {
  if (spec.workers() < 0 || spec.workers() > kMaxWorkers) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.workers: ", spec.workers(), " is outside 1..", kMaxWorkers));
  }
  if (spec.max_retries() < 0 || spec.max_retries() > kMaxRetries) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.max_retries: ", spec.max_retries(), " is outside 0..", kMaxRetries));
  }
  if (spec.max_retries() > 0 && !RunsAsWorkers(spec)) {
    return absl::InvalidArgumentError(
        "spec.max_retries: only jobs of several workers retry (a job in kilnd's process resumes "
        "after a restart instead)");
  }
  return absl::OkStatus();
}

bool HoldsTokens(const DatasetInfo& info) {
  return info.format == DatasetFormat::kText || info.format == DatasetFormat::kTokens;
}

// Whether the dataset suits the job: a classifier's samples and labels, or a language model's
// tokens (its run in iterations, its vocabulary covering the data's ids).
absl::Status CheckDataFitsJob(const TrainConfig& config, const DatasetInfo& info,
                              const std::string& name) {
  const std::string which = absl::StrCat("dataset \"", name, "\"");
  if (HoldsTokens(info)) {
    if (config.max_iters == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.max_iters: ", which,
                       " holds tokens: a language model trains on it for "
                       "max_iters iterations (epochs do not apply)"));
    }
    if (config.augment.enabled()) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.augment: ", which, " holds tokens, not images"));
    }
    // A text dataset's vocabulary, or for pre-tokenized shards the ids they hold.
    const int64_t vocab = info.vocab_size > 0 ? info.vocab_size : info.max_token + 1;
    absl::Status fit = CheckModelFitsTokens(config.model, vocab, which);
    if (!fit.ok()) return absl::Status(fit.code(), absl::StrCat("spec.model: ", fit.message()));
    return absl::OkStatus();
  }
  if (config.max_iters > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.max_iters: ", which, " holds samples, not tokens: set epochs"));
  }
  ModelPart culprit;
  absl::Status fit =
      CheckModelFitsData(config.model, info.sample_shape, info.num_classes, which, &culprit);
  if (fit.ok()) return fit;
  return absl::Status(
      fit.code(),
      absl::StrCat(culprit == ModelPart::kInputShape ? "spec.model.input_shape: " : "spec.model: ",
                   fit.message()));
}

}  // namespace

absl::StatusOr<std::string> JobAdmission::ResolveDevice(const std::string& requested) const {
  return kiln::ResolveDevice(requested.empty() ? default_device_ : requested);
}

absl::Status JobAdmission::CheckJobMemory(const TrainConfig& config, const DatasetInfo& info,
                                          const std::string& device) const {
  MemoryTarget target;
  target.device = device == "cpu" ? DeviceKind::kCpu : DeviceKind::kCuda;
  // Jobs side by side on the CPU each take their share of the cores (JobRunner).
  target.threads = CpuBackendThreads({0, std::max(1, max_jobs_per_device_)});
  target.precision = config.precision;
  const bool tokens = HoldsTokens(info);
  KILN_ASSIGN_OR_RETURN(MemoryPlan plan,
                        PlanTrainingMemory(config, tokens ? info.train_tokens : info.train_samples,
                                           tokens ? info.val_tokens : info.test_samples, target));
  const int64_t need = plan.total_bytes();
  const int64_t limit = limits_.max_job_memory_bytes;
  if (need <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("spec: the job needs ", FormatBytes(need),
                   " of memory (the most: ", plan.largest().Describe(), "), over the limit of ",
                   FormatBytes(limit), " (", limit, " bytes, --max_job_memory_bytes)"));
}

absl::StatusOr<AdmittedJob> JobAdmission::Admit(const v1::JobSpec& spec) const {
  KILN_ASSIGN_OR_RETURN(TrainConfig config, TranslateSpec(spec, limits_));
  KILN_RETURN_IF_ERROR(CheckWorkerFields(spec));
  if (spec.dataset().empty()) {
    return absl::InvalidArgumentError("spec.dataset: required (see ListDatasets)");
  }
  absl::StatusOr<DatasetInfo> info = datasets_->Inspect(spec.dataset());
  if (!info.ok()) {
    const absl::StatusCode code = absl::IsNotFound(info.status())
                                      ? absl::StatusCode::kNotFound
                                      : absl::StatusCode::kInvalidArgument;
    return absl::Status(code, absl::StrCat("spec.dataset: ", info.status().message()));
  }
  KILN_RETURN_IF_ERROR(CheckDataFitsJob(config, *info, spec.dataset()));
  if (config.augment.enabled()) {
    absl::StatusOr<AugmentGeometry> images =
        AugmentImageGeometry(config.augment, info->sample_shape,
                             info->format == DatasetFormat::kCsv, config.norm.channels());
    if (!images.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("spec.augment: dataset \"", spec.dataset(),
                                                     "\": ", images.status().message()));
    }
  }
  if (absl::Status batches =
          CheckBatchNormBatches(config.model, config.batch_size, info->train_samples);
      !batches.ok()) {
    return absl::Status(batches.code(), absl::StrCat("spec.batch_size: ", batches.message()));
  }
  absl::StatusOr<std::string> device =
      RunsAsWorkers(spec) ? CheckWorkers(spec, config, *info) : ResolveDevice(spec.device());
  if (!device.ok()) {
    if (RunsAsWorkers(spec)) return device.status();
    return absl::InvalidArgumentError(absl::StrCat("spec.device: ", device.status().message()));
  }
  // A worker's share of the batch needs less; the whole batch on one device is the bound kept.
  KILN_RETURN_IF_ERROR(CheckJobMemory(config, *info, *device == "cpu" ? "cpu" : "cuda:0"));

  return AdmittedJob{std::move(config), *std::move(device)};
}

absl::StatusOr<std::string> JobAdmission::CheckWorkers(const v1::JobSpec& spec,
                                                       const TrainConfig& config,
                                                       const DatasetInfo& info) const {
  if (workers_.registry == nullptr) {
    return absl::FailedPreconditionError(
        "spec.workers: this kilnd does not run jobs of several workers");
  }
  const int workers = std::max(1, spec.workers());
  if (!spec.external_workers() && !workers_.local_workers_refusal.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("spec.workers: ", workers_.local_workers_refusal));
  }
  if (!spec.external_workers() && access(workers_.worker_binary.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("spec.workers: kilnd cannot start workers: ", workers_.worker_binary,
                     " is not an executable (--worker_binary)"));
  }
  if (absl::Status split =
          // A token run's every step is a whole batch of windows.
      CheckDataParallelBatches(config.model, config.batch_size,
                               HoldsTokens(info) ? config.batch_size : info.train_samples, workers);
      !split.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.workers: ", split.message()));
  }
  std::string kind = spec.device().empty() ? default_device_ : spec.device();
  if (kind == "auto") kind = AvailableDevices().size() > 1 ? "cuda" : "cpu";
  if (kind == "cpu") return kind;
  if (kind != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.device: a job of ", workers,
                     " workers takes \"cpu\" or \"cuda\" (one GPU each), "
                     "not \"",
                     kind, "\""));
  }
  if (spec.external_workers()) return kind;  // their GPUs are on their own machines
  int gpus = 0;
  for (const std::string& d : AvailableDevices()) gpus += d.starts_with("cuda:") ? 1 : 0;
  if (gpus < workers) {
    return absl::FailedPreconditionError(absl::StrCat("spec.workers: ", workers,
                                                      " workers on \"cuda\" need as many GPUs; "
                                                      "this machine has ",
                                                      gpus));
  }
  return kind;
}

}  // namespace kiln::server
