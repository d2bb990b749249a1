#include "server/jobs/job_manager.h"

#include <pthread.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <new>
#include <optional>
#include <random>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/client_message.h"
#include "common/shown_paths.h"
#include "common/status_macros.h"
#include "engine/backend_registry.h"
#include "engine/model/model.h"
#include "engine/trainer.h"
#include "server/checkpoints/checkpoint_integrity.h"
#include "server/jobs/job_vocabulary.h"
#include "server/jobs/proto_time.h"

namespace kiln::server {
namespace {

// Event numbers past this are refused: seq + 1 must never overflow, whatever a store holds.
constexpr int64_t kMaxEventSeq = int64_t{1} << 62;

// What a job's own row holds that kilnd never writes, or "".
std::string JobRowDamage(const v1::Job& job) {
  std::vector<std::string> found;
  auto check = [&](const char* field, int64_t value) {
    if (value < 0) found.push_back(absl::StrCat(field, " ", value));
  };
  check("epochs", job.epochs());
  check("epochs_done", job.epochs_done());
  check("global_step", job.global_step());
  check("resumed_from_step", job.resumed_from_step());
  check("attempts", job.attempts());
  check("retries", job.retries());
  check("crash_resumes", job.crash_resumes());
  if (job.epochs_done() > job.epochs()) {
    found.push_back(
        absl::StrCat("epochs_done ", job.epochs_done(), " of its ", job.epochs(), " epochs"));
  }
  if (found.empty()) return "";
  return absl::StrCat("the job's row holds ", absl::StrJoin(found, ", "));
}

// The GPUs a job holds while it runs: a gang's one per worker, any other CUDA job's one.
int GpusWanted(const v1::Job& job) {
  if (!job.device().starts_with("cuda")) return 0;
  return IsGang(job) ? std::max(1, job.spec().workers()) : 1;
}

// A job as kilnd answers it: with its resolved spec and its precision's wording, worked out
// afresh (never stored).
v1::Job WithResolvedSpec(v1::Job job) {
  *job.mutable_resolved_spec() = ResolvedSpec(job.spec());
  job.set_precision_text(JobPrecisionText(job.spec().precision(), job.device()));
  return job;
}

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
                      options_.step_delay},
      admission_(datasets, options_.limits, options_.default_device, options_.max_jobs_per_device,
                 &options_.workers),
      store_retry_([this] { StoreRetryLoop(); }) {}

JobManager::~JobManager() {
  Shutdown(absl::InfiniteDuration()).IgnoreError();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_store_retry_ = true;
    store_retry_cv_.notify_all();
  }
  store_retry_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (std::thread& t : finished_threads_) {
    if (t.joinable()) t.join();
  }
}

absl::StatusOr<std::shared_ptr<JobSlot>> JobManager::FindLocked(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return JobNotFound(job_id);
  return it->second;
}

absl::Status JobNotFound(const std::string& job_id) {
  return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
}

absl::Status JobManager::SetStateLocked(JobSlot& slot, v1::JobState state,
                                        const std::string& reason) {
  v1::Job next = slot.job;
  const v1::JobState from = next.state();
  next.set_state(state);
  next.set_reason(WithShownPaths(reason));  // reasons are read by clients
  if (IsFinal(state)) *next.mutable_end_time() = MillisToTimestamp(NowMillis());
  // One source of truth: what the store refused was neither announced nor applied.
  if (absl::Status recorded = events_.StateChanged(next, from, &slot.next_seq); !recorded.ok()) {
    StoreFailedLocked(recorded);
    return recorded;
  }
  slot.job = std::move(next);
  slot.unrecorded_state.reset();
  return absl::OkStatus();
}

void JobManager::SetOrQueueStateLocked(JobSlot& slot, v1::JobState state,
                                       const std::string& reason) {
  if (!SetStateLocked(slot, state, reason).ok()) slot.unrecorded_state = {state, reason};
}

void JobManager::StoreFailedLocked(const absl::Status& error) {
  store_error_ = std::string(error.message());
  if (!store_writable_) return;
  store_writable_ = false;
  if (options_.on_store_writable) options_.on_store_writable(false);
  store_retry_cv_.notify_all();
}

absl::Status JobManager::RequireWritableStoreLocked() const {
  if (store_writable_) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("kilnd is read-only: its store refuses writes (", store_error_,
                   "); it takes new work again once they succeed, tried every ",
                   absl::FormatDuration(options_.store_retry_interval)));
}

bool JobManager::store_writable() {
  std::lock_guard<std::mutex> lock(mu_);
  return store_writable_;
}

void JobManager::StoreRetryLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_store_retry_) {
    store_retry_cv_.wait_for(lock, absl::ToChronoNanoseconds(options_.store_retry_interval));
    if (stop_store_retry_ || store_writable_) continue;
    bool recorded_all = true;
    for (auto& [id, slot] : jobs_) {  // in id order; each job's own changes stay in order
      if (!slot->unrecorded_state.has_value()) continue;
      const auto [state, reason] = *slot->unrecorded_state;
      if (!SetStateLocked(*slot, state, reason).ok()) {
        recorded_all = false;
        break;
      }
    }
    if (!recorded_all) continue;
    if (absl::Status probe = store_->ProbeWrite(); !probe.ok()) {
      store_error_ = std::string(probe.message());
      continue;
    }
    store_writable_ = true;
    store_error_.clear();
    if (options_.on_store_writable) options_.on_store_writable(true);
    ScheduleLocked();
  }
}

absl::Status JobManager::Recover() {
  KILN_ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, store_->AllJobs());
  const std::map<std::string, std::string> damaged_rows = store_->DamagedJobs();
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<JobSlot>> resumed, queued;
  for (v1::Job& job : jobs) {
    auto slot = std::make_shared<JobSlot>();
    KILN_ASSIGN_OR_RETURN(int64_t max_seq, store_->MaxSeq(job.id()));
    std::vector<std::string> damage;
    if (auto it = damaged_rows.find(job.id()); it != damaged_rows.end()) {
      damage.push_back(it->second);
    }
    if (std::string row = JobRowDamage(job); !row.empty()) damage.push_back(std::move(row));
    const bool numbered = max_seq >= 0 && max_seq < kMaxEventSeq;
    if (!numbered) damage.push_back(absl::StrCat("an event is numbered ", max_seq));
    slot->next_seq = numbered ? max_seq + 1 : kMaxEventSeq;
    slot->job = std::move(job);
    jobs_[slot->job.id()] = slot;
    events_.Recovered(slot->job);
    // A damaged job is not run again: it fails, saying what is wrong, and every other job is
    // served as usual. Its rows stay, for a person to look at.
    if (!damage.empty()) {
      FailDamagedLocked(*slot, absl::StrJoin(damage, "; "), numbered);
      continue;
    }
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
      SetOrQueueStateLocked(
          *slot, v1::JOB_STATE_FAILED,
          absl::StrCat("spec refused after restart: ", config.status().message()));
      return true;
    });
  }
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
    SetOrQueueStateLocked(
        *slot, v1::JOB_STATE_FAILED,
        absl::StrCat("kilnd stopped without a clean shutdown ", job.crash_resumes(),
                     " times while this job ran (--max_crash_resumes=", options_.max_crash_resumes,
                     "); it is not resumed again"));
    return true;
  });
  // Jobs that were running go first: they had their turn already.
  for (const auto& slot : resumed) {
    absl::Status device = RunsAsWorkers(slot->job.spec()) && slot->job.device() == "cuda"
                              ? absl::OkStatus()
                              : ValidateDevice(slot->job.device());
    if (!device.ok()) {
      SetOrQueueStateLocked(*slot, v1::JOB_STATE_FAILED,
                            absl::StrCat("device ", slot->job.device(),
                                         " unavailable after restart: ", device.message()));
      continue;
    }
    // On a full disk kilnd still starts, read-only: the job waits in the queue, its change to
    // QUEUED retried with the others until the store takes writes again.
    SetOrQueueStateLocked(*slot, v1::JOB_STATE_QUEUED,
                          "kilnd restarted; resuming from the latest checkpoint");
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

void JobManager::FailDamagedLocked(JobSlot& slot, const std::string& damage, bool numbered) {
  damaged_.insert(slot.job.id());
  if (slot.job.state() == v1::JOB_STATE_FAILED) return;
  const std::string reason =
      absl::StrCat("kilnd found this job's record in its store damaged at start (", damage,
                   "); it is not run again");
  if (numbered) {
    SetOrQueueStateLocked(slot, v1::JOB_STATE_FAILED, reason);
    return;
  }
  // No event can follow the last one: the state goes into the job's row alone.
  slot.job.set_state(v1::JOB_STATE_FAILED);
  slot.job.set_reason(ClientMessage(reason));
  *slot.job.mutable_end_time() = MillisToTimestamp(NowMillis());
  if (absl::Status s = store_->PutJob(slot.job); !s.ok()) StoreFailedLocked(s);
}

absl::StatusOr<v1::Job> JobManager::Submit(const v1::JobSpec& spec, const v1::Owner& owner) {
  KILN_ASSIGN_OR_RETURN(AdmittedJob admitted, admission_.Admit(spec));
  TrainConfig& config = admitted.config;
  const std::string& device = admitted.device;

  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return absl::UnavailableError("kilnd is shutting down");
  KILN_RETURN_IF_ERROR(RequireWritableStoreLocked());
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
  if (!owner.user().empty() || !owner.team().empty()) *job.mutable_owner() = owner;
  // The interval a language model's run takes by default, kept, so readers of the job need not
  // know the rule (clients count iterations with it).
  if (config.max_iters > 0)
    job.mutable_spec()->set_eval_interval(static_cast<int32_t>(config.eval_interval));
  job.set_device(device);
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
  return WithResolvedSpec(std::move(result));
}

absl::StatusOr<std::string> JobManager::WorkerToken(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<JobSlot> slot, FindLocked(job_id));
  if (!RunsAsWorkers(slot->job.spec()) || options_.workers.registry == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " runs in kilnd's process; it has no workers"));
  }
  return options_.workers.registry->TokenFor(job_id);
}

absl::StatusOr<v1::Job> JobManager::Get(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<JobSlot> slot, FindLocked(job_id));
  return WithResolvedSpec(slot->job);
}

absl::StatusOr<std::string> JobManager::OwnerTeam(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<JobSlot> slot, FindLocked(job_id));
  return slot->job.owner().team();
}

absl::StatusOr<JobPage> JobManager::List(const std::vector<v1::JobState>& states, int page_size,
                                         const std::string& page_token,
                                         const std::optional<std::string>& team) {
  KILN_ASSIGN_OR_RETURN(JobPage page, store_->ListJobs(states, page_size, page_token, team));
  // The in-memory copy has the live step count; the store's has everything else as well.
  std::lock_guard<std::mutex> lock(mu_);
  for (v1::Job& job : page.jobs) {
    auto it = jobs_.find(job.id());
    if (it != jobs_.end()) job = it->second->job;
    job = WithResolvedSpec(std::move(job));
  }
  return page;
}

absl::StatusOr<v1::Job> JobManager::Cancel(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<JobSlot> slot, FindLocked(job_id));
  switch (slot->job.state()) {
    case v1::JOB_STATE_QUEUED: {
      std::deque<std::string>& queue = queues_[slot->job.device()];
      KILN_RETURN_IF_ERROR(SetStateLocked(*slot, v1::JOB_STATE_CANCELLED, "cancelled by request"));
      queue.erase(std::remove(queue.begin(), queue.end(), job_id), queue.end());
      --queued_count_;
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
  return WithResolvedSpec(slot->job);
}

absl::StatusOr<v1::Job> JobManager::Resume(const std::string& job_id, int epochs,
                                           int64_t checkpoint_id) {
  // A named checkpoint is verified now (reading it whole, so outside the lock), so a damaged one
  // is refused to the caller instead of failing the run later.
  std::optional<v1::Checkpoint> from;
  if (checkpoint_id != 0) {
    KILN_ASSIGN_OR_RETURN(from, FindCheckpoint(job_id, checkpoint_id));
    KILN_RETURN_IF_ERROR(VerifyCheckpointFile(*from));
  }
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
  if (damaged_.contains(job_id)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id,
                                                      "'s record in the store is damaged (",
                                                      job.reason(), "); it cannot be resumed"));
  }
  const int total = epochs == 0 ? job.epochs() : epochs;
  if (from.has_value() && total <= from->epochs_done()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", checkpoint_id, " of job ", job_id, " has ", from->epochs_done(),
                     " of ", total, " epochs done; ask for more epochs to resume from it"));
  }
  if (!from.has_value() && total <= job.epochs_done()) {
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
  KILN_RETURN_IF_ERROR(RequireWritableStoreLocked());
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
  if (from.has_value()) {  // still indexed: a DeleteCheckpoint may have come in between
    KILN_ASSIGN_OR_RETURN(std::vector<v1::Checkpoint> indexed, store_->Checkpoints(job_id));
    if (std::none_of(indexed.begin(), indexed.end(),
                     [&](const v1::Checkpoint& c) { return c.id() == checkpoint_id; })) {
      return absl::NotFoundError(
          absl::StrCat("checkpoint ", checkpoint_id, " of job ", job_id, " was just deleted"));
    }
  }
  const v1::Job before = job;
  const int config_epochs = slot->config->epochs;
  slot->config->epochs = total;
  slot->cancel = false;
  job.set_epochs(total);
  job.set_resume_checkpoint_id(checkpoint_id);
  if (absl::Status queued = SetStateLocked(*slot, v1::JOB_STATE_QUEUED, "resumed by request");
      !queued.ok()) {
    job = before;
    slot->config->epochs = config_epochs;
    return queued;
  }
  queues_[job.device()].push_back(job_id);
  ++queued_count_;
  v1::Job result = job;
  ScheduleLocked();
  return WithResolvedSpec(std::move(result));
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
    v1::JobEvent& e = watch.current_state.emplace();
    e.set_seq(max_seq);
    *e.mutable_time() = MillisToTimestamp(NowMillis());
    e.set_replayed(true);
    e.mutable_state()->set_state(job.state());
    e.mutable_state()->set_reason(job.reason());
    return watch;
  }
  watch.history = std::make_unique<EventReplay>(store_, job_id, max_seq, include_steps,
                                                options_.replay_page_events);
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

absl::StatusOr<v1::Checkpoint> JobManager::DeleteCheckpoint(const std::string& job_id,
                                                            int64_t checkpoint_id) {
  KILN_ASSIGN_OR_RETURN(v1::Checkpoint checkpoint, FindCheckpoint(job_id, checkpoint_id));
  {
    std::lock_guard<std::mutex> lock(mu_);
    KILN_ASSIGN_OR_RETURN(std::shared_ptr<JobSlot> slot, FindLocked(job_id));
    const v1::Job& job = slot->job;
    if (!IsFinal(job.state()) && job.resume_checkpoint_id() == checkpoint_id) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", checkpoint_id, " is the one job ", job_id, " (",
                       JobStateName(job.state()), ") resumes from; cancel the job first"));
    }
    // Out of the index first: a crash between the two steps leaves a file nothing names, never
    // an index entry without its file.
    KILN_RETURN_IF_ERROR(store_->DeleteCheckpoint(checkpoint_id));
  }
  std::error_code ec;
  std::filesystem::remove(checkpoint.path(), ec);
  return checkpoint;
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
  if (shutting_down_ || !store_writable_) return;
  for (auto& [device, queue] : queues_) {
    while (!queue.empty()) {
      const std::optional<size_t> next = NextToStartLocked(queue);
      if (!next.has_value()) break;
      const std::shared_ptr<JobSlot> slot = jobs_[queue[*next]];
      std::string why;
      std::vector<std::string> devices = DevicesToStartLocked(*slot, &why);
      if (devices.empty()) {
        // The first in line waits, and so does everything behind it; it may ask a job of a
        // lower priority for its slot. The queue says why.
        if (why.empty()) why = PreemptForLocked(*slot);
        NoteWhyQueuedLocked(*slot, why);
        break;
      }
      slot->devices = std::move(devices);
      if (!StartLocked(slot)) return;
      queue.erase(queue.begin() + static_cast<std::ptrdiff_t>(*next));
    }
  }
}

std::map<std::string, TeamUsage> JobManager::TeamUsageLocked() const {
  std::map<std::string, TeamUsage> usage;
  for (const auto& [id, slot] : jobs_) {
    if (slot->job.state() != v1::JOB_STATE_RUNNING || slot->devices.empty()) continue;
    TeamUsage& u = usage[slot->job.owner().team()];
    ++u.running_jobs;
    for (const std::string& d : slot->devices) u.gpus += d.starts_with("cuda") ? 1 : 0;
  }
  return usage;
}

std::optional<size_t> JobManager::NextToStartLocked(const std::deque<std::string>& queue) {
  const std::map<std::string, TeamUsage> usage = TeamUsageLocked();
  std::vector<QueuedJob> queued;
  queued.reserve(queue.size());
  for (const std::string& id : queue) {
    const v1::Job& job = jobs_[id]->job;
    queued.push_back({id, job.spec().priority(), job.owner().team()});
  }
  for (size_t i : StartOrder(queued, usage)) {
    JobSlot& slot = *jobs_[queue[i]];
    const auto team = usage.find(queued[i].team);
    const std::string over =
        QuotaBlock(queued[i].team, team == usage.end() ? TeamUsage() : team->second,
                   GpusWanted(slot.job), options_.team_quota);
    // A team at its quota waits; the jobs of others behind it do not.
    if (!over.empty()) {
      NoteWhyQueuedLocked(slot, over);
      continue;
    }
    return i;
  }
  return std::nullopt;
}

std::string JobManager::PreemptForLocked(const JobSlot& waiting) {
  const v1::Job& job = waiting.job;
  // A gang needs several GPUs freed at once: it waits for them (see DevicesToStartLocked).
  if (IsGang(job)) return "";
  std::vector<RunningJob> running;
  for (const auto& [id, slot] : jobs_) {
    if (slot->job.state() != v1::JOB_STATE_RUNNING || slot->devices.empty()) continue;
    running.push_back({id, slot->job.spec().priority(), !slot->job.spec().non_preemptible(),
                       slot->preempt || slot->stop || slot->cancel,
                       TimestampToMillis(slot->job.start_time()), slot->devices});
  }
  std::string victim;
  if (!ChoosePreemption(job.spec().priority(), job.device(), running, &victim)) return "";
  if (victim.empty()) return "waiting for a stopping job to free its slot";
  JobSlot& stopping = *jobs_[victim];
  stopping.preempted_by = job.id();
  stopping.preempt = true;
  if (options_.on_preempt) options_.on_preempt(stopping.job, job);
  return absl::StrCat("preempting ", victim, " (priority ",
                      PriorityName(stopping.job.spec().priority()), ")");
}

void JobManager::NoteWhyQueuedLocked(JobSlot& slot, const std::string& why) {
  if (why.empty() || slot.job.reason() == why) return;
  slot.job.set_reason(why);
  store_->PutJob(slot.job).IgnoreError();
}

void JobManager::RequeuePreemptedLocked(const std::shared_ptr<JobSlot>& slot) {
  const std::string reason = absl::StrCat("preempted by ", slot->preempted_by);
  if (!SetStateLocked(*slot, v1::JOB_STATE_QUEUED, reason).ok()) {
    // The store refuses writes: it stays RUNNING there, as after a shutdown, and the next start
    // resumes it from the checkpoint it just wrote.
    slot->job.set_interrupted_by_shutdown(true);
    events_.Interrupted(slot->job);
    return;
  }
  // Back in its place by submission, not at the end: jobs that came after it do not overtake it
  // because it was preempted.
  std::deque<std::string>& queue = queues_[slot->job.device()];
  const int64_t submitted = TimestampToMillis(slot->job.create_time());
  auto place = std::find_if(queue.begin(), queue.end(), [&](const std::string& id) {
    return TimestampToMillis(jobs_[id]->job.create_time()) > submitted;
  });
  queue.insert(place, slot->job.id());
  ++queued_count_;
}

std::vector<std::string> JobManager::DevicesToStartLocked(const JobSlot& slot, std::string* why) {
  const std::string& device = slot.job.device();
  const int workers = std::max(1, slot.job.spec().workers());
  if (!IsGang(slot.job)) {
    if (running_[device] >= options_.max_jobs_per_device) return {};
    return {device};
  }
  // Gang: every worker's GPU at once, or none; lowest numbers first.
  std::vector<std::string> free;
  for (const std::string& d : AvailableDevices()) {
    if (d.starts_with("cuda:") && running_[d] < options_.max_jobs_per_device) free.push_back(d);
  }
  if (static_cast<int>(free.size()) < workers) {
    *why = absl::StrCat("waiting for ", workers, " free GPUs (", free.size(), " free now)");
    return {};
  }
  free.resize(workers);
  return free;
}

bool JobManager::StartLocked(const std::shared_ptr<JobSlot>& slot) {
  const v1::Job before = slot->job;
  slot->job.set_attempts(slot->job.attempts() + 1);
  *slot->job.mutable_start_time() = MillisToTimestamp(NowMillis());
  slot->job.clear_end_time();
  if (!SetStateLocked(*slot, v1::JOB_STATE_RUNNING, "").ok()) {
    slot->job = before;  // stays first in its queue, started once the store takes writes
    return false;
  }
  --queued_count_;
  for (const std::string& d : slot->devices) ++running_[d];
  ++active_threads_;
  slot->stop = false;
  // Named after the job (Linux keeps 15 characters), so that top -H and perf tell jobs apart;
  // the OpenMP team it starts inherits the name.
  slot->thread = std::thread([this, slot, name = slot->job.id().substr(0, 15)] {
    pthread_setname_np(pthread_self(), name.c_str());
    RunJob(slot);
  });
  return true;
}

void JobManager::RunJob(std::shared_ptr<JobSlot> slot) {
  // Nothing thrown may leave the job's thread (it would abort kilnd, and a resumed job would
  // abort it again): it becomes the job's FAILED reason.
  absl::Status status;
  try {
    status = RunsAsWorkers(slot->job.spec())
                 ? RunWorkerAttempts(*slot)
                 : JobRunner(slot.get(), &mu_, store_, &events_, datasets_, runner_options_).Run();
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
  // Cleared whatever the outcome: a preemption that a success, a cancel or a shutdown overtook
  // must not stop the job's next run.
  const bool preempted = slot->preempt.exchange(false);
  // A final state the store refuses is retried until recorded; until then the job is RUNNING,
  // as the store says, and a restart resumes it.
  if (status.ok()) {
    SetOrQueueStateLocked(*slot, v1::JOB_STATE_SUCCEEDED, "");
  } else if (slot->cancel) {
    SetOrQueueStateLocked(*slot, v1::JOB_STATE_CANCELLED, "cancelled by request");
  } else if (slot->stop) {
    // Left RUNNING in the store on purpose: the next start resumes it, not as a crash.
    slot->job.set_interrupted_by_shutdown(true);
    events_.Interrupted(slot->job);
  } else if (preempted) {
    RequeuePreemptedLocked(slot);
  } else {
    SetOrQueueStateLocked(*slot, v1::JOB_STATE_FAILED, std::string(status.message()));
  }
  for (CheckpointDone& done : waiters) {
    done(absl::FailedPreconditionError(absl::StrCat("job ", slot->job.id(), " stopped (",
                                                    JobStateName(slot->job.state()),
                                                    ") before the checkpoint was written")));
  }
  for (const std::string& d : slot->devices) --running_[d];
  slot->devices.clear();
  --active_threads_;
  finished_threads_.push_back(std::move(slot->thread));
  ScheduleLocked();
  idle_cv_.notify_all();
}

absl::Status JobManager::RunWorkerAttempts(JobSlot& slot) {
  while (true) {
    std::vector<std::string> devices;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const int workers = std::max(1, slot.job.spec().workers());
      if (IsGang(slot.job)) {
        devices = slot.devices;  // the gang's GPUs
      } else {
        devices.assign(workers, slot.job.device() == "cuda" ? "cuda:0" : slot.job.device());
      }
    }
    absl::Status status =
        WorkerJobRunner(&slot, &mu_, store_, &events_, datasets_, devices, options_.workers).Run();
    if (status.ok() || slot.cancel || slot.stop || slot.preempt) return status;
    std::lock_guard<std::mutex> lock(mu_);
    if (slot.job.retries() >= slot.job.spec().max_retries() || shutting_down_) return status;
    // Again from the latest checkpoint, as a new attempt with a state event saying why.
    slot.job.set_retries(slot.job.retries() + 1);
    slot.job.set_attempts(slot.job.attempts() + 1);
    const std::string reason =
        absl::StrCat("attempt failed: ", status.message(), "; retry ", slot.job.retries(), " of ",
                     slot.job.spec().max_retries(), " from the latest checkpoint");
    if (!SetStateLocked(slot, v1::JOB_STATE_RUNNING, reason).ok()) return status;
  }
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
