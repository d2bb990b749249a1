#include "server/jobs/worker_job_runner.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <new>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/shown_paths.h"
#include "common/status_macros.h"
#include "engine/backend_registry.h"
#include "engine/model/checkpoint.h"
#include "engine/model/model.h"
#include "engine/model/model_config_json.h"
#include "engine/optim/optimizer.h"
#include "engine/trainer.h"
#include "server/checkpoints/checkpoint_integrity.h"
#include "server/checkpoints/checkpoint_policy.h"
#include "server/jobs/checkpoint_record.h"
#include "server/jobs/event_messages.h"
#include "server/jobs/job_vocabulary.h"
#include "server/jobs/training_run.h"

extern char** environ;

namespace kiln::server {
namespace fs = std::filesystem;
namespace {

// The last non-empty line of a worker's log, to name in the job's reason.
std::string LastLine(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  if (last.size() > 300) last = last.substr(last.size() - 300);
  return last;
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("was killed by signal ", WTERMSIG(status));
  return "stopped";
}

// The most bytes a checkpoint of `model` takes: its parameters, their optimizer state (Adam's
// two slots at most) and the layers' buffers are each at most 4 bytes a parameter; the header
// (names, the model's JSON, the position) fits in the slack.
int64_t CheckpointBytesBound(const ModelConfig& model) {
  constexpr int64_t kPerParameter = 16;
  constexpr int64_t kSlack = int64_t{16} << 20;
  const int64_t parameters = CountParameters(model);
  if (parameters > (std::numeric_limits<int64_t>::max() - kSlack) / kPerParameter) {
    return std::numeric_limits<int64_t>::max();
  }
  return parameters * kPerParameter + kSlack;
}

// Whether the file at `path` is a checkpoint of `config`'s model at the header's position, as
// resume and deploy will read it: every parameter, buffer and optimizer state of the model there,
// with its shape, and nothing truncated.
absl::Status VerifyHandedOver(const std::string& path, const TrainConfig& config,
                              const v1::WriteCheckpointHeader& header, const std::string& job_id) {
  auto not_one = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the file rank 0 handed over is not a checkpoint of job ", job_id, "'s model: ", why));
  };
  absl::StatusOr<CheckpointInfo> info = ReadCheckpointInfo(path);
  if (!info.ok()) return not_one(info.status().message());
  if (ModelConfigToJson(info->model) != ModelConfigToJson(config.model)) {
    return not_one("it holds another model");
  }
  if (info->position.epochs_done != header.epochs_done() ||
      info->position.global_step != header.global_step()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the checkpoint rank 0 handed over is at epochs_done ", info->position.epochs_done,
        ", step ", info->position.global_step, ", where its header says epochs_done ",
        header.epochs_done(), ", global_step ", header.global_step()));
  }
  BackendOptions one_thread;
  one_thread.threads = 1;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend("cpu", one_thread));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                        Model::Build(config.model, backend.get(), /*seed=*/0));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
                        Optimizer::Create(config.optimizer, backend.get(), model->parameters()));
  TrainingPosition position;
  if (absl::Status s = ReadCheckpoint(path, *model, optimizer.get(), &position); !s.ok()) {
    return not_one(s.message());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::Checkpoint> WorkerJobRunner::ChooseStart() {
  std::string job_id;
  int64_t pinned = 0;
  {
    std::lock_guard<std::mutex> lock(*mu_);
    job_id = slot_->job.id();
    pinned = slot_->job.resume_checkpoint_id();
  }
  KILN_ASSIGN_OR_RETURN(std::vector<v1::Checkpoint> checkpoints, store_->Checkpoints(job_id));
  std::reverse(checkpoints.begin(), checkpoints.end());  // newest written first
  if (pinned != 0) {
    std::erase_if(checkpoints, [&](const v1::Checkpoint& c) { return c.id() != pinned; });
    if (checkpoints.empty()) {
      return absl::NotFoundError(
          absl::StrCat("checkpoint ", pinned, ", which the job was resumed from, was deleted"));
    }
  }
  // As the in-process runner: a damaged checkpoint is passed over for the next one, saying so.
  std::string passed_over;
  for (const v1::Checkpoint& c : checkpoints) {
    absl::Status verified = VerifyCheckpointFile(c);
    if (verified.ok()) {
      if (!passed_over.empty()) {
        std::lock_guard<std::mutex> lock(*mu_);
        slot_->job.set_reason(WithShownPaths(
            absl::StrCat("resumed from checkpoint ", c.id(), ", passing over ", passed_over)));
      }
      return c;
    }
    if (pinned != 0 || &c == &checkpoints.back()) {
      return absl::Status(verified.code(), absl::StrCat("resuming from checkpoint ", c.id(), ": ",
                                                        verified.message()));
    }
    absl::StrAppend(&passed_over, passed_over.empty() ? "" : "; ", "checkpoint ", c.id(), ": ",
                    verified.message());
  }
  return v1::Checkpoint();  // none: from scratch
}

absl::StatusOr<WorkerPlan> WorkerJobRunner::Plan(const v1::Checkpoint& start) {
  WorkerPlan plan;
  std::string dataset;
  {
    std::lock_guard<std::mutex> lock(*mu_);
    if (!slot_->config.has_value()) return absl::InternalError("the job's spec is not translated");
    plan.batch_size = slot_->config->batch_size;
    dataset = slot_->job.spec().dataset();
  }
  KILN_ASSIGN_OR_RETURN(const DatasetInfo info, datasets_->Inspect(dataset));
  plan.world_size = static_cast<int>(devices_.size());
  plan.epochs = epochs_;
  plan.steps_per_epoch = StepsPerEpoch(info.train_samples, std::max(1, plan.batch_size));
  plan.test_samples = info.test_samples;
  plan.start_epochs_done = start.epochs_done();
  plan.start_global_step = start.global_step();
  return plan;
}

absl::Status WorkerJobRunner::OnReport(int rank, const v1::WorkerReport& report) {
  std::lock_guard<std::mutex> lock(*mu_);
  KILN_RETURN_IF_ERROR(check_->Check(rank, report));
  if (report.has_step()) {
    const v1::WorkerStep& step = report.step();
    double rate = step.seconds() > 0 ? step.rank_samples() / step.seconds() : 0;
    if (!std::isfinite(rate)) rate = 0;  // a step of a denormal second
    rank_rates_[rank] = rate;
    events_->WorkerStep(slot_->job.id(), rank, static_cast<int>(devices_.size()), rate,
                        step.allreduce_seconds(), step.allreduce_bytes());
    if (rank != 0) return absl::OkStatus();
    slot_->job.set_global_step(step.metrics().global_step());
    absl::Status s = events_->Step(slot_->job, StepEventOf(step.metrics()), step.samples(),
                                   step.seconds(), &slot_->next_seq, &rank_rates_);
    return s;
  }
  if (report.has_epoch() && rank == 0) {
    const EpochEvent e = EpochEventOf(report.epoch().metrics());
    BestEpoch best(slot_->job.best_test_accuracy());
    if (best.Observe(e)) slot_->job.set_best_test_accuracy(best.best());
    slot_->job.set_epochs_done(e.epoch);
    // Its known fields only: what else a worker put in the message is not the job's to keep.
    *slot_->job.mutable_last_epoch() = EpochMetricsOf(e);
    return events_->Epoch(slot_->job, e, epochs_, &slot_->next_seq);
  }
  return absl::OkStatus();
}

absl::Status WorkerJobRunner::AdmitCheckpointLocked(const v1::WriteCheckpointHeader& h) {
  const int64_t last_step =
      plan_.steps_per_epoch > 0 && plan_.epochs > 0 &&
              plan_.steps_per_epoch > std::numeric_limits<int64_t>::max() / plan_.epochs
          ? std::numeric_limits<int64_t>::max()
          : plan_.steps_per_epoch * plan_.epochs;
  const std::string plan =
      absl::StrCat("the job's ", plan_.epochs, " epochs of ", plan_.steps_per_epoch,
                   " steps, this attempt starting at step ", plan_.start_global_step);
  if (h.epochs_done() < plan_.start_epochs_done || h.epochs_done() > plan_.epochs) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint epochs_done ", h.epochs_done(),
                                                   " is outside ", plan_.start_epochs_done, "..",
                                                   plan_.epochs, " (", plan, ")"));
  }
  if (h.global_step() < plan_.start_global_step || h.global_step() > last_step) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint global_step ", h.global_step(),
                                                   " is outside ", plan_.start_global_step, "..",
                                                   last_step, " (", plan, ")"));
  }
  if (!std::isfinite(h.write_seconds()) || h.write_seconds() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint write_seconds ", h.write_seconds(),
                                                   " must be finite and not negative"));
  }
  if (h.global_step() < recorded_.global_step || h.epochs_done() < recorded_.epochs_done) {
    return absl::FailedPreconditionError(
        absl::StrCat("a checkpoint at epochs_done ", h.epochs_done(), ", global_step ",
                     h.global_step(), " is behind this attempt's last, at epochs_done ",
                     recorded_.epochs_done, ", global_step ", recorded_.global_step));
  }
  const CheckpointSettings policy =
      TranslateCheckpointPolicy(slot_->job.spec().checkpoint_policy());
  const int epochs = h.epochs_done();
  auto refused = [&](absl::string_view why) {
    return absl::FailedPreconditionError(
        absl::StrCat("a ", CheckpointKindName(h.kind()), " checkpoint at epochs_done ", epochs,
                     ", global_step ", h.global_step(), ": ", why));
  };
  switch (h.kind()) {
    case v1::CHECKPOINT_KIND_PERIODIC:
      if (policy.every_n_epochs <= 0 || epochs < 1 || epochs % policy.every_n_epochs != 0) {
        return refused(absl::StrCat("the job's policy has every_n_epochs ", policy.every_n_epochs));
      }
      if (recorded_.periodic_epochs.contains(epochs)) return refused("one is recorded already");
      return absl::OkStatus();
    case v1::CHECKPOINT_KIND_BEST:
      if (!policy.keep_best || epochs < 1) return refused("the job's policy keeps no best");
      if (recorded_.best_epochs.contains(epochs)) return refused("one is recorded already");
      return absl::OkStatus();
    case v1::CHECKPOINT_KIND_ON_DEMAND:
      if (recorded_.on_demand >= on_demand_asked_.load()) {
        return refused("none was asked for (CreateCheckpoint), or it was taken already");
      }
      return absl::OkStatus();
    case v1::CHECKPOINT_KIND_SHUTDOWN:
      if (!stop_sent_.load() || !policy.on_shutdown) {
        return refused("kilnd is not stopping the job for a shutdown, or its policy writes none");
      }
      if (recorded_.shutdown) return refused("one is recorded already");
      return absl::OkStatus();
    case v1::CHECKPOINT_KIND_CANCEL:
      if (!cancel_sent_.load() || !policy.on_shutdown) {
        return refused("the job was not cancelled, or its policy writes none");
      }
      if (recorded_.cancel) return refused("one is recorded already");
      return absl::OkStatus();
    case v1::CHECKPOINT_KIND_FINAL:
      if (epochs != plan_.epochs) {
        return refused(absl::StrCat("epochs_done must be the job's ", plan_.epochs, " epochs"));
      }
      if (recorded_.final) return refused("one is recorded already");
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint kind ", static_cast<int>(h.kind()),
                       " is not one a run writes (periodic, best, on_demand, shutdown, cancel, "
                       "final)"));
  }
}

absl::StatusOr<int64_t> WorkerJobRunner::AdmitCheckpoint(const v1::WriteCheckpointHeader& header) {
  std::lock_guard<std::mutex> lock(*mu_);
  KILN_RETURN_IF_ERROR(AdmitCheckpointLocked(header));
  return CheckpointBytesBound(config_->model);
}

absl::StatusOr<v1::Checkpoint> WorkerJobRunner::OnCheckpoint(
    const v1::WriteCheckpointHeader& header, const std::string& path) {
  absl::Status admitted;
  {
    std::lock_guard<std::mutex> lock(*mu_);
    admitted = AdmitCheckpointLocked(header);  // as when it began, now the bytes are in
  }
  // On a service thread, where nothing thrown may go: the model is built to load the file into.
  try {
    if (admitted.ok()) admitted = VerifyHandedOver(path, *config_, header, slot_->job.id());
  } catch (const std::bad_alloc&) {
    admitted = absl::ResourceExhaustedError(
        "out of memory while checking the checkpoint rank 0 handed over (std::bad_alloc)");
  }
  absl::StatusOr<v1::Checkpoint> c =
      admitted.ok() ? RecordCheckpoint(slot_, mu_, store_, events_, path,
                                       {header.kind(), header.epochs_done(), header.global_step(),
                                        header.write_seconds()})
                    : absl::StatusOr<v1::Checkpoint>(admitted);
  if (c.ok()) {
    std::lock_guard<std::mutex> lock(*mu_);
    recorded_.global_step = header.global_step();
    recorded_.epochs_done = header.epochs_done();
    switch (header.kind()) {
      case v1::CHECKPOINT_KIND_PERIODIC:
        recorded_.periodic_epochs.insert(header.epochs_done());
        break;
      case v1::CHECKPOINT_KIND_BEST:
        recorded_.best_epochs.insert(header.epochs_done());
        break;
      case v1::CHECKPOINT_KIND_ON_DEMAND:
        ++recorded_.on_demand;
        break;
      case v1::CHECKPOINT_KIND_SHUTDOWN:
        recorded_.shutdown = true;
        break;
      case v1::CHECKPOINT_KIND_CANCEL:
        recorded_.cancel = true;
        break;
      case v1::CHECKPOINT_KIND_FINAL:
        recorded_.final = true;
        break;
      default:
        break;
    }
  }
  if (header.kind() == v1::CHECKPOINT_KIND_ON_DEMAND) {
    std::vector<CheckpointDone> waiters;
    {
      std::lock_guard<std::mutex> lock(*mu_);
      waiters.swap(slot_->checkpoint_waiters);
    }
    for (CheckpointDone& done : waiters) done(c);
  }
  return c;
}

absl::Status WorkerJobRunner::StartLocalWorkers(const std::string& coordinator,
                                                const std::string& token, int attempt) {
  if (access(options_.worker_binary.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot start workers: ", options_.worker_binary,
                     " is not an executable (--worker_binary)"));
  }
  const std::string log_dir = absl::StrCat(options_.state_dir, "/workers/", slot_->job.id());
  std::error_code ec;
  fs::create_directories(log_dir, ec);
  // The token goes in the environment, never the command line (ps shows that to everyone).
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string_view(*e).starts_with("KILN_WORKER_TOKEN=")) continue;
    env_strings.emplace_back(*e);
  }
  env_strings.push_back(absl::StrCat("KILN_WORKER_TOKEN=", token));
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  for (int rank = 0; rank < static_cast<int>(devices_.size()); ++rank) {
    Worker w;
    w.rank = rank;
    w.log_path = absl::StrCat(log_dir, "/attempt-", attempt, "-rank-", rank, ".log");
    std::vector<std::string> args = {
        options_.worker_binary, "--coordinator", coordinator,        "--job",
        slot_->job.id(),        "--rank",        absl::StrCat(rank), "--data_dir",
        options_.data_dir};
    args.insert(args.end(), options_.worker_args.begin(), options_.worker_args.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, w.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    // Its own process group, so that a terminal's Ctrl-C reaches kilnd alone, which then stops
    // the workers itself.
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    const int err = posix_spawn(&w.pid, options_.worker_binary.c_str(), &actions, &attr,
                                argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    if (err != 0) {
      return absl::InternalError(absl::StrCat("starting worker rank ", rank, " (",
                                              options_.worker_binary, "): ", strerror(err)));
    }
    workers_.push_back(w);
  }
  return absl::OkStatus();
}

absl::Status WorkerJobRunner::ReapExited(const WorkerAttempt::Snapshot& state) {
  for (Worker& w : workers_) {
    if (w.reaped) continue;
    int status = 0;
    if (waitpid(w.pid, &status, WNOHANG) != w.pid) continue;
    w.reaped = true;
    const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (clean && state.ranks[w.rank] == RankState::kDone) continue;
    if (state.ranks[w.rank] == RankState::kFailed) continue;  // it said why; that is the reason
    const std::string last = LastLine(w.log_path);
    return absl::UnavailableError(
        absl::StrCat("worker rank ", w.rank, " (pid ", w.pid, ") ", DescribeExit(status),
                     last.empty() ? "" : absl::StrCat(": ", last), " (log: ", w.log_path, ")"));
  }
  return absl::OkStatus();
}

void WorkerJobRunner::StopWorkers() {
  auto alive = [&] {
    int n = 0;
    for (Worker& w : workers_) {
      if (w.reaped) continue;
      int status = 0;
      if (waitpid(w.pid, &status, WNOHANG) == w.pid) {
        w.reaped = true;
      } else {
        ++n;
      }
    }
    return n;
  };
  if (alive() == 0) return;
  for (Worker& w : workers_) {
    if (!w.reaped) kill(w.pid, SIGTERM);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (alive() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  for (Worker& w : workers_) {
    if (w.reaped) continue;
    kill(w.pid, SIGKILL);
    waitpid(w.pid, nullptr, 0);
    w.reaped = true;
  }
}

absl::Status WorkerJobRunner::CheckHeartbeats(const WorkerAttempt::Snapshot& state,
                                              absl::Time now) const {
  std::vector<int> silent;
  for (int r = 0; r < static_cast<int>(state.ranks.size()); ++r) {
    const bool training =
        state.ranks[r] == RankState::kJoined || state.ranks[r] == RankState::kReporting;
    if (training && now - state.last_heard[r] > options_.heartbeat_timeout) silent.push_back(r);
  }
  if (silent.empty()) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat(
      "worker rank", silent.size() > 1 ? "s " : " ", absl::StrJoin(silent, ", "),
      " sent no report and no keep-alive for ", absl::FormatDuration(options_.heartbeat_timeout),
      " (--worker_heartbeat_timeout): taken for hung or gone"));
}

absl::Status WorkerJobRunner::Supervise(WorkerAttempt& attempt, bool external) {
  const absl::Time join_deadline =
      absl::Now() + (external ? options_.external_join_timeout : options_.join_timeout);
  absl::Time stop_deadline = absl::InfiniteFuture();
  bool told_to_stop = false;
  while (true) {
    const WorkerAttempt::Snapshot state = attempt.State();
    if (!state.failure.ok()) return state.failure;
    if (std::all_of(state.ranks.begin(), state.ranks.end(),
                    [](RankState r) { return r == RankState::kDone; })) {
      return absl::OkStatus();
    }
    KILN_RETURN_IF_ERROR(ReapExited(state));
    const absl::Time now = absl::Now();
    KILN_RETURN_IF_ERROR(CheckHeartbeats(state, now));
    std::vector<int> missing;
    for (int r = 0; r < static_cast<int>(state.ranks.size()); ++r) {
      if (state.ranks[r] == RankState::kWaiting) missing.push_back(r);
    }
    if (!missing.empty() && now > join_deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "worker rank", missing.size() > 1 ? "s " : " ", absl::StrJoin(missing, ", "),
          " did not join within ",
          absl::FormatDuration(external ? options_.external_join_timeout : options_.join_timeout)));
    }
    // A preemption stops the workers as a shutdown does (their policy's checkpoint, then stop):
    // the gang goes back to the queue as one unit.
    if (!told_to_stop && (slot_->cancel || slot_->stop || slot_->preempt)) {
      (slot_->cancel ? cancel_sent_ : stop_sent_) = true;  // before rank 0 can act on it
      attempt.Command(slot_->cancel ? v1::WorkerCommand::ACTION_CANCEL
                                    : v1::WorkerCommand::ACTION_STOP);
      told_to_stop = true;
      stop_deadline = now + options_.stop_grace;
      // Workers still joining never hear it: there is nothing of theirs to keep.
      if (!missing.empty()) {
        return slot_->cancel ? absl::CancelledError("cancelled before every worker joined")
                             : absl::AbortedError("kilnd is shutting down");
      }
    }
    if (now > stop_deadline) {
      return absl::DeadlineExceededError(absl::StrCat("the workers did not stop within ",
                                                      absl::FormatDuration(options_.stop_grace),
                                                      " of being asked to"));
    }
    if (slot_->checkpoint_wanted.exchange(false)) {
      ++on_demand_asked_;
      attempt.Command(v1::WorkerCommand::ACTION_CHECKPOINT);
    }
    attempt.WaitForChange(absl::Milliseconds(200));
  }
}

absl::Status WorkerJobRunner::Run() {
  if (options_.registry == nullptr) return absl::InternalError("no worker registry");
  v1::JobSpec spec;
  std::string job_id;
  int attempt_number = 0;
  {
    std::lock_guard<std::mutex> lock(*mu_);
    spec = slot_->job.spec();
    job_id = slot_->job.id();
    epochs_ = slot_->job.epochs();
    attempt_number = slot_->job.attempts();
  }
  KILN_ASSIGN_OR_RETURN(v1::Checkpoint start, ChooseStart());
  KILN_ASSIGN_OR_RETURN(const WorkerPlan plan, Plan(start));
  {
    std::lock_guard<std::mutex> lock(*mu_);
    slot_->job.set_resumed_from_step(start.global_step());
    slot_->job.set_global_step(start.global_step());
    slot_->job.set_epochs_done(start.epochs_done());
    KILN_RETURN_IF_ERROR(store_->PutJob(slot_->job));
    rank_rates_.assign(devices_.size(), 0);
    check_.emplace(plan);
    plan_ = plan;
    config_ = slot_->config;
    recorded_.global_step = start.global_step();
    recorded_.epochs_done = start.epochs_done();
  }
  if (slot_->stop) return absl::AbortedError("kilnd is shutting down");

  const int world = static_cast<int>(devices_.size());
  v1::JoinJobResponse join;
  join.set_attempt(attempt_number);
  join.set_world_size(world);
  *join.mutable_spec() = spec;
  join.set_epochs(epochs_);
  const int threads = options_.cpu_threads > 0
                          ? options_.cpu_threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  join.set_cpu_threads(spec.external_workers() ? 0 : std::max(1, threads / world));
  if (start.id() != 0) {
    v1::Checkpoint shown = start;
    shown.clear_path();  // kilnd's own file system is none of the workers' business
    *join.mutable_resume_from() = shown;
  }
  join.set_collective_timeout_ms(absl::ToInt64Milliseconds(options_.collective_timeout));
  // Four chances to be heard within the timeout.
  join.set_keep_alive_interval_ms(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(options_.heartbeat_timeout / 4)));
  join.set_step_delay_ms(absl::ToInt64Milliseconds(options_.step_delay));
  join.set_dataset(spec.dataset());
  {
    std::lock_guard<std::mutex> lock(*mu_);
    join.set_best_test_accuracy(slot_->job.best_test_accuracy());
  }

  WorkerAttempt::Hooks hooks;
  hooks.on_report = [this](int rank, const v1::WorkerReport& r) { return OnReport(rank, r); };
  hooks.admit_checkpoint = [this](const v1::WriteCheckpointHeader& h) {
    return AdmitCheckpoint(h);
  };
  hooks.record_checkpoint = [this](const v1::WriteCheckpointHeader& h, const std::string& path) {
    return OnCheckpoint(h, path);
  };
  auto attempt =
      std::make_shared<WorkerAttempt>(job_id, std::move(join), devices_, hooks,
                                      options_.registry->limits(), options_.registry->key_budget());
  options_.registry->Add(attempt);
  events_->TrainingStarted(job_id, spec, epochs_);

  absl::Status result;
  if (!spec.external_workers()) {
    absl::StatusOr<std::string> coordinator =
        options_.registry->CoordinatorAddress(options_.join_timeout);
    result = coordinator.status();
    if (result.ok()) {
      result = StartLocalWorkers(*coordinator, options_.registry->TokenFor(job_id), attempt_number);
    }
  }
  if (result.ok()) result = Supervise(*attempt, spec.external_workers());
  // Ends the attempt before the workers go, so that nothing they still send is taken.
  attempt->End();
  options_.registry->Remove(attempt.get());
  StopWorkers();
  return result;
}

}  // namespace kiln::server
