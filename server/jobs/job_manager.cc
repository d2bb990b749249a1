#include "server/jobs/job_manager.h"

#include <pthread.h>

#include <algorithm>
#include <exception>
#include <new>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "engine/backend_registry.h"
#include "engine/memory_plan.h"
#include "engine/model.h"
#include "engine/trainer.h"
#include "server/jobs/job_vocabulary.h"
#include "server/jobs/proto_time.h"

namespace kiln::server {
namespace {

std::string NewJobId() {
  std::random_device rd;
  uint64_t bits = (uint64_t{rd()} << 32) | rd();
  return absl::StrFormat("job-%012x", bits & 0xffffffffffffull);
}

}  // namespace

JobManager::JobManager(JobStore* store, MetricBroadcaster* broadcaster, DatasetCatalog* datasets,
                       JobManagerOptions options)
    : store_(store),
      events_(store, broadcaster, options.observers),
      datasets_(datasets),
      options_(std::move(options)),
      runner_options_{options_.state_dir, options_.limits, options_.max_jobs_per_device,
                      options_.step_delay} {}

JobManager::~JobManager() {
  Shutdown(absl::InfiniteDuration()).IgnoreError();
  std::lock_guard<std::mutex> lock(mu_);
  for (std::thread& t : finished_threads_) {
    if (t.joinable()) t.join();
  }
}

absl::StatusOr<std::string> JobManager::ResolveDevice(const std::string& requested) const {
  return kiln::ResolveDevice(requested.empty() ? options_.default_device : requested);
}

absl::Status JobManager::CheckJobMemory(const TrainConfig& config, const DatasetInfo& info,
                                        const std::string& device) const {
  MemoryTarget target;
  target.device = device == "cpu" ? DeviceKind::kCpu : DeviceKind::kCuda;
  // Jobs side by side on the CPU each take their share of the cores (JobRunner).
  target.threads = CpuBackendThreads({0, std::max(1, options_.max_jobs_per_device)});
  KILN_ASSIGN_OR_RETURN(MemoryPlan plan,
                        PlanTrainingMemory(config, info.train_samples, info.test_samples, target));
  const int64_t need = plan.total_bytes();
  const int64_t limit = options_.limits.max_job_memory_bytes;
  if (need <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("spec: the job needs ", FormatBytes(need),
                   " of memory (the most: ", plan.largest().Describe(), "), over the limit of ",
                   FormatBytes(limit), " (", limit, " bytes, --max_job_memory_bytes)"));
}

absl::StatusOr<std::shared_ptr<JobSlot>> JobManager::FindLocked(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  return it->second;
}

absl::Status JobManager::SetStateLocked(JobSlot& slot, v1::JobState state,
                                        const std::string& reason) {
  const v1::JobState from = slot.job.state();
  slot.job.set_state(state);
  slot.job.set_reason(reason);
  if (IsFinal(state)) *slot.job.mutable_end_time() = MillisToTimestamp(NowMillis());
  return events_.StateChanged(slot.job, from, &slot.next_seq);
}

absl::Status JobManager::Recover() {
  KILN_ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, store_->AllJobs());
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<JobSlot>> resumed, queued;
  absl::Status recover_error;
  for (v1::Job& job : jobs) {
    auto slot = std::make_shared<JobSlot>();
    KILN_ASSIGN_OR_RETURN(int64_t max_seq, store_->MaxSeq(job.id()));
    slot->next_seq = max_seq + 1;
    slot->job = std::move(job);
    jobs_[slot->job.id()] = slot;
    events_.Recovered(slot->job);
    if (slot->job.state() == v1::JOB_STATE_RUNNING) resumed.push_back(slot);
    if (slot->job.state() == v1::JOB_STATE_QUEUED) queued.push_back(slot);
  }
  // The spec is translated once per job: here for the jobs that will run again. One that no
  // longer passes (kilnd restarted with tighter limits) fails now, saying why.
  for (auto* list : {&resumed, &queued}) {
    std::erase_if(*list, [&](const std::shared_ptr<JobSlot>& slot) {
      absl::StatusOr<TrainConfig> config = TranslateSpec(slot->job.spec(), options_.limits);
      if (config.ok()) {
        config->epochs = slot->job.epochs();  // more than the spec's when it was resumed
        slot->config = *std::move(config);
        return false;
      }
      recover_error.Update(
          SetStateLocked(*slot, v1::JOB_STATE_FAILED,
                         absl::StrCat("spec refused after restart: ", config.status().message())));
      return true;
    });
  }
  KILN_RETURN_IF_ERROR(recover_error);
  // A job found running that no clean shutdown stopped was running when kilnd died, and may be
  // why: it runs again at most max_crash_resumes times over its life.
  std::erase_if(resumed, [&](const std::shared_ptr<JobSlot>& slot) {
    v1::Job& job = slot->job;
    if (job.interrupted_by_shutdown()) {
      job.set_interrupted_by_shutdown(false);
      return false;
    }
    job.set_crash_resumes(job.crash_resumes() + 1);
    if (job.crash_resumes() <= options_.max_crash_resumes) return false;
    recover_error.Update(SetStateLocked(
        *slot, v1::JOB_STATE_FAILED,
        absl::StrCat("kilnd stopped without a clean shutdown ", job.crash_resumes(),
                     " times while this job ran (--max_crash_resumes=", options_.max_crash_resumes,
                     "); it is not resumed again")));
    return true;
  });
  KILN_RETURN_IF_ERROR(recover_error);
  // Jobs that were running go first: they had their turn already.
  for (const auto& slot : resumed) {
    absl::Status device = ValidateDevice(slot->job.device());
    if (!device.ok()) {
      KILN_RETURN_IF_ERROR(
          SetStateLocked(*slot, v1::JOB_STATE_FAILED,
                         absl::StrCat("device ", slot->job.device(),
                                      " unavailable after restart: ", device.message())));
      continue;
    }
    KILN_RETURN_IF_ERROR(SetStateLocked(*slot, v1::JOB_STATE_QUEUED,
                                        "kilnd restarted; resuming from the latest checkpoint"));
    queues_[slot->job.device()].push_back(slot->job.id());
    ++queued_count_;
  }
  for (const auto& slot : queued) {
    queues_[slot->job.device()].push_back(slot->job.id());
    ++queued_count_;
  }
  ScheduleLocked();
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> JobManager::Submit(const v1::JobSpec& spec) {
  KILN_ASSIGN_OR_RETURN(TrainConfig config, TranslateSpec(spec, options_.limits));
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
  ModelPart culprit;
  if (absl::Status fit =
          CheckModelFitsData(config.model, info->sample_shape, info->num_classes,
                             absl::StrCat("dataset \"", spec.dataset(), "\""), &culprit);
      !fit.ok()) {
    return absl::Status(fit.code(),
                        absl::StrCat(culprit == ModelPart::kInputShape ? "spec.model.input_shape: "
                                                                       : "spec.model: ",
                                     fit.message()));
  }
  absl::StatusOr<std::string> device = ResolveDevice(spec.device());
  if (!device.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.device: ", device.status().message()));
  }
  KILN_RETURN_IF_ERROR(CheckJobMemory(config, *info, *device));

  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return absl::UnavailableError("kilnd is shutting down");
  // DeleteDataset holds this lock too: the dataset checked above may have gone since.
  if (!datasets_->Exists(spec.dataset())) {
    return absl::NotFoundError(absl::StrCat("spec.dataset: dataset \"", spec.dataset(),
                                            "\" was deleted while the job was being submitted"));
  }
  if (queued_count_ >= options_.max_queued_jobs) {
    return absl::ResourceExhaustedError(absl::StrCat("the queue is full: ", queued_count_,
                                                     " jobs are waiting (limit ",
                                                     options_.max_queued_jobs, ")"));
  }
  auto slot = std::make_shared<JobSlot>();
  v1::Job& job = slot->job;
  do {
    job.set_id(NewJobId());
  } while (jobs_.count(job.id()) > 0);
  *job.mutable_spec() = spec;
  job.set_device(*device);
  *job.mutable_create_time() = MillisToTimestamp(NowMillis());
  job.set_epochs(config.epochs);
  job.set_parameter_count(CountParameters(config.model));
  slot->config = std::move(config);
  KILN_RETURN_IF_ERROR(SetStateLocked(*slot, v1::JOB_STATE_QUEUED, ""));
  jobs_[job.id()] = slot;
  queues_[job.device()].push_back(job.id());
  ++queued_count_;
  v1::Job result = job;
  events_.Submitted(result);
  ScheduleLocked();
  return result;
}

absl::StatusOr<v1::Job> JobManager::Get(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<JobSlot> slot, FindLocked(job_id));
  return slot->job;
}

absl::StatusOr<JobPage> JobManager::List(const std::vector<v1::JobState>& states, int page_size,
                                         const std::string& page_token) {
  KILN_ASSIGN_OR_RETURN(JobPage page, store_->ListJobs(states, page_size, page_token));
  // The in-memory copy has the live step count; the store's has everything else as well.
  std::lock_guard<std::mutex> lock(mu_);
  for (v1::Job& job : page.jobs) {
    auto it = jobs_.find(job.id());
    if (it != jobs_.end()) job = it->second->job;
  }
  return page;
}

absl::StatusOr<v1::Job> JobManager::Cancel(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<JobSlot> slot, FindLocked(job_id));
  switch (slot->job.state()) {
    case v1::JOB_STATE_QUEUED: {
      std::deque<std::string>& queue = queues_[slot->job.device()];
      queue.erase(std::remove(queue.begin(), queue.end(), job_id), queue.end());
      --queued_count_;
      KILN_RETURN_IF_ERROR(SetStateLocked(*slot, v1::JOB_STATE_CANCELLED, "cancelled by request"));
      break;
    }
    case v1::JOB_STATE_RUNNING:
      // The trainer checks the flag between steps; the runner then records CANCELLED.
      slot->cancel = true;
      break;
    default:
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " already ended (", JobStateName(slot->job.state()),
                       "); only queued or running jobs can be cancelled"));
  }
  return slot->job;
}

absl::StatusOr<v1::Job> JobManager::Resume(const std::string& job_id, int epochs) {
  std::lock_guard<std::mutex> lock(mu_);
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<JobSlot> slot, FindLocked(job_id));
  v1::Job& job = slot->job;
  if (!IsFinal(job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is ", JobStateName(job.state()),
                     "; only cancelled, failed or succeeded jobs can be resumed"));
  }
  if (epochs < 0 || epochs > options_.limits.max_epochs) {
    return absl::InvalidArgumentError(
        absl::StrCat("epochs: must be in [0, ", options_.limits.max_epochs, "], got ", epochs));
  }
  const int total = epochs == 0 ? job.epochs() : epochs;
  if (total <= job.epochs_done()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " has trained ",
                                                      job.epochs_done(), " of ", total,
                                                      " epochs; ask for more epochs to resume it"));
  }
  if (!datasets_->Exists(job.spec().dataset())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " trains on dataset \"", job.spec().dataset(),
        "\", which no longer exists (deleted); upload it again under that name to resume"));
  }
  if (shutting_down_) return absl::UnavailableError("kilnd is shutting down");
  if (queued_count_ >= options_.max_queued_jobs) {
    return absl::ResourceExhaustedError("the queue is full");
  }
  // The run trains to config->epochs. A job that had ended before a restart has no translated
  // spec yet (Recover translates only the jobs that run again).
  if (!slot->config.has_value()) {
    absl::StatusOr<TrainConfig> config = TranslateSpec(job.spec(), options_.limits);
    if (!config.ok()) {
      return absl::Status(config.status().code(),
                          absl::StrCat("spec refused: ", config.status().message()));
    }
    slot->config = *std::move(config);
  }
  slot->config->epochs = total;
  slot->cancel = false;
  job.set_epochs(total);
  KILN_RETURN_IF_ERROR(SetStateLocked(*slot, v1::JOB_STATE_QUEUED, "resumed by request"));
  queues_[job.device()].push_back(job_id);
  ++queued_count_;
  v1::Job result = job;
  ScheduleLocked();
  return result;
}

absl::Status JobManager::DeleteDataset(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> users;
  for (const auto& [id, slot] : jobs_) {
    const v1::JobState state = slot->job.state();
    if (slot->job.spec().dataset() == name &&
        (state == v1::JOB_STATE_QUEUED || state == v1::JOB_STATE_RUNNING)) {
      users.push_back(absl::StrCat(id, " (", JobStateName(state), ")"));
    }
  }
  if (!users.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("dataset \"", name, "\" is in use by ",
                                                      absl::StrJoin(users, ", "),
                                                      "; cancel them or wait for them to end"));
  }
  // Under the lock, so no submission of a job on it can slip in between check and removal.
  return datasets_->Delete(name);
}

absl::StatusOr<JobWatch> JobManager::Watch(const std::string& job_id, bool include_steps,
                                           bool live_only) {
  JobWatch watch;
  int64_t max_seq;
  v1::Job job;
  {
    // Subscribing and reading the last seq together means history (seq <= max_seq) and live
    // events (seq > max_seq) neither overlap nor leave a gap.
    std::lock_guard<std::mutex> lock(mu_);
    KILN_ASSIGN_OR_RETURN(std::shared_ptr<JobSlot> slot, FindLocked(job_id));
    max_seq = slot->next_seq - 1;
    job = slot->job;
    if (!IsFinal(job.state())) watch.live = events_.Subscribe(job_id, include_steps);
  }
  if (live_only) {
    v1::JobEvent& e = watch.history.emplace_back();
    e.set_seq(max_seq);
    *e.mutable_time() = MillisToTimestamp(NowMillis());
    e.set_replayed(true);
    e.mutable_state()->set_state(job.state());
    e.mutable_state()->set_reason(job.reason());
    return watch;
  }
  absl::StatusOr<std::vector<v1::JobEvent>> history =
      store_->Events(job_id, max_seq, include_steps);
  if (!history.ok()) {
    if (watch.live) events_.Unsubscribe(watch.live);
    return history.status();
  }
  watch.history = *std::move(history);
  return watch;
}

void JobManager::RequestCheckpoint(const std::string& job_id, CheckpointDone done) {
  absl::Status refusal;
  {
    std::lock_guard<std::mutex> lock(mu_);
    absl::StatusOr<std::shared_ptr<JobSlot>> slot = FindLocked(job_id);
    if (!slot.ok()) {
      refusal = slot.status();
    } else if ((*slot)->job.state() != v1::JOB_STATE_RUNNING) {
      refusal = absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " is ", JobStateName((*slot)->job.state()),
                       "; only a running job can be checkpointed (see ListCheckpoints)"));
    } else {
      (*slot)->checkpoint_waiters.push_back(std::move(done));
      (*slot)->checkpoint_wanted = true;
      return;
    }
  }
  done(refusal);
}

absl::StatusOr<std::vector<v1::Checkpoint>> JobManager::ListCheckpoints(const std::string& job_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    KILN_RETURN_IF_ERROR(FindLocked(job_id).status());
  }
  return store_->Checkpoints(job_id);
}

absl::StatusOr<v1::Checkpoint> JobManager::FindCheckpoint(const std::string& job_id,
                                                          int64_t checkpoint_id) {
  KILN_ASSIGN_OR_RETURN(std::vector<v1::Checkpoint> all, ListCheckpoints(job_id));
  if (checkpoint_id == 0) {
    if (all.empty())
      return absl::NotFoundError(absl::StrCat("job ", job_id, " has no checkpoints"));
    return all.back();
  }
  for (const v1::Checkpoint& c : all) {
    if (c.id() == checkpoint_id) return c;
  }
  return absl::NotFoundError(
      absl::StrCat("checkpoint ", checkpoint_id, " of job ", job_id, " not found"));
}

absl::StatusOr<std::unique_ptr<CheckpointExport>> JobManager::ExportCheckpoint(
    const std::string& job_id, int64_t checkpoint_id, int chunk_bytes) {
  KILN_ASSIGN_OR_RETURN(v1::Checkpoint checkpoint, FindCheckpoint(job_id, checkpoint_id));
  return CheckpointExport::Open(std::move(checkpoint), chunk_bytes);
}

void JobManager::ReapThreadsLocked() {
  const std::thread::id self = std::this_thread::get_id();
  auto keep = std::partition(finished_threads_.begin(), finished_threads_.end(),
                             [&](const std::thread& t) { return t.get_id() == self; });
  for (auto it = keep; it != finished_threads_.end(); ++it) {
    if (it->joinable()) it->join();  // it already left mu_ and is returning
  }
  finished_threads_.erase(keep, finished_threads_.end());
}

void JobManager::ScheduleLocked() {
  ReapThreadsLocked();
  if (shutting_down_) return;
  for (auto& [device, queue] : queues_) {
    while (!queue.empty() && running_[device] < options_.max_jobs_per_device) {
      std::shared_ptr<JobSlot> slot = jobs_[queue.front()];
      queue.pop_front();
      StartLocked(slot);
    }
  }
}

void JobManager::StartLocked(const std::shared_ptr<JobSlot>& slot) {
  --queued_count_;
  ++running_[slot->job.device()];
  ++active_threads_;
  slot->stop = false;
  slot->job.set_attempts(slot->job.attempts() + 1);
  *slot->job.mutable_start_time() = MillisToTimestamp(NowMillis());
  slot->job.clear_end_time();
  SetStateLocked(*slot, v1::JOB_STATE_RUNNING, "").IgnoreError();  // retried at the next change
  // Named after the job (Linux keeps 15 characters), so that top -H and perf tell jobs apart;
  // the OpenMP team it starts inherits the name.
  slot->thread = std::thread([this, slot, name = slot->job.id().substr(0, 15)] {
    pthread_setname_np(pthread_self(), name.c_str());
    RunJob(slot);
  });
}

void JobManager::RunJob(std::shared_ptr<JobSlot> slot) {
  // Nothing thrown may leave the job's thread (it would abort kilnd, and a resumed job would
  // abort it again): it becomes the job's FAILED reason.
  absl::Status status;
  try {
    status = JobRunner(slot.get(), &mu_, store_, &events_, datasets_, runner_options_).Run();
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError("out of memory while training (std::bad_alloc)");
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat("internal error while training: ", e.what()));
  } catch (...) {
    status = absl::InternalError("internal error while training: an unknown exception");
  }
  std::vector<CheckpointDone> waiters;
  std::lock_guard<std::mutex> lock(mu_);
  waiters.swap(slot->checkpoint_waiters);
  slot->checkpoint_wanted = false;
  if (status.ok()) {
    SetStateLocked(*slot, v1::JOB_STATE_SUCCEEDED, "").IgnoreError();
  } else if (slot->cancel) {
    SetStateLocked(*slot, v1::JOB_STATE_CANCELLED, "cancelled by request").IgnoreError();
  } else if (slot->stop) {
    // Left RUNNING in the store on purpose: the next start resumes it, not as a crash.
    slot->job.set_interrupted_by_shutdown(true);
    events_.Interrupted(slot->job);
  } else {
    SetStateLocked(*slot, v1::JOB_STATE_FAILED, std::string(status.message())).IgnoreError();
  }
  for (CheckpointDone& done : waiters) {
    done(absl::FailedPreconditionError(absl::StrCat("job ", slot->job.id(), " stopped (",
                                                    JobStateName(slot->job.state()),
                                                    ") before the checkpoint was written")));
  }
  --running_[slot->job.device()];
  --active_threads_;
  finished_threads_.push_back(std::move(slot->thread));
  ScheduleLocked();
  idle_cv_.notify_all();
}

absl::Status JobManager::Shutdown(absl::Duration deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  shutting_down_ = true;
  for (auto& [id, slot] : jobs_) {
    if (slot->job.state() == v1::JOB_STATE_RUNNING) slot->stop = true;
  }
  auto is_idle = [&] { return active_threads_ == 0; };
  bool idle = true;
  if (deadline == absl::InfiniteDuration()) {
    idle_cv_.wait(lock, is_idle);
  } else {
    idle = idle_cv_.wait_for(lock, absl::ToChronoNanoseconds(deadline), is_idle);
  }
  ReapThreadsLocked();
  if (!idle) {
    return absl::DeadlineExceededError(
        absl::StrCat(active_threads_, " jobs still running at the shutdown deadline"));
  }
  return absl::OkStatus();
}

}  // namespace kiln::server
