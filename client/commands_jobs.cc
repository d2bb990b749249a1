// kiln submit, watch, jobs, get, cancel and resume: the training job commands.
#include <sys/ioctl.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <memory>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli_status.h"
#include "client/command_env.h"
#include "client/format.h"
#include "client/interrupt.h"
#include "client/progress_view.h"
#include "client/spec_details.h"
#include "client/spec_file.h"
#include "client/table.h"
#include "common/status_macros.h"
#include "kiln/v1/training.grpc.pb.h"

namespace kiln::client {
namespace {

struct SubmitOptions {
  std::string spec_file;
  SpecOverrides overrides;
  int epochs = 0, batch_size = 0;
  double lr = 0, momentum = 0, weight_decay = 0;
  uint64_t seed = 0;
  int workers = 1, max_retries = 0;
  bool watch = false;
  CLI::Option *epochs_opt = nullptr, *batch_opt = nullptr, *lr_opt = nullptr, *seed_opt = nullptr;
  CLI::Option *momentum_opt = nullptr, *weight_decay_opt = nullptr;
  CLI::Option *workers_opt = nullptr, *max_retries_opt = nullptr;
};

// The job's device, with its worker count for a job of several ("cpu x2").
std::string DeviceText(const v1::Job& job) {
  if (job.spec().workers() <= 1) return job.device();
  return absl::StrCat(job.device(), " x", job.spec().workers());
}

bool IsFinal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

int TerminalWidth(std::FILE* out) {
  winsize ws{};
  if (ioctl(fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  const char* columns = std::getenv("COLUMNS");
  return columns != nullptr && std::atoi(columns) > 0 ? std::atoi(columns) : 100;
}

absl::StatusOr<v1::Job> FetchJob(Connection& c, const std::string& job_id) {
  auto stub = v1::Training::NewStub(c.channel());
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::Job job;
  auto context = c.NewContext();
  grpc::Status status = stub->GetJob(context.get(), request, &job);
  if (!status.ok()) return ServerError(status);
  return job;
}

// Follows a job to its end, drawing progress; OK only when it SUCCEEDED.
absl::Status WatchJob(CommandEnv& env, const std::string& job_id) {
  KILN_ASSIGN_OR_RETURN(Connection * c, env.Connect());
  KILN_ASSIGN_OR_RETURN(v1::Job job, FetchJob(*c, job_id));
  const bool tty = isatty(fileno(env.out)) != 0 && !env.json();
  ProgressView view(env.out, tty ? ProgressView::Style::kLive : ProgressView::Style::kPlain, job,
                    tty ? TerminalWidth(env.out) : 100);

  auto stub = v1::Training::NewStub(c->channel());
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  request.set_include_steps(true);
  std::unique_ptr<grpc::ClientContext> context = c->NewContext(absl::InfiniteDuration());
  std::atomic<bool> detached{false};
  grpc::Status status;
  {
    ScopedInterruptHandler on_interrupt([&] {
      detached = true;
      view.ClearLine();
      context->TryCancel();
    });
    auto reader = stub->WatchJob(context.get(), request);
    v1::JobEvent event;
    while (reader->Read(&event)) {
      if (env.json()) {
        std::fprintf(env.out, "%s\n", MessageToJson(event, /*pretty=*/false).c_str());
        std::fflush(env.out);
      } else {
        view.OnEvent(event);
      }
    }
    status = reader->Finish();
  }
  if (detached) {
    view.ClearLine();
    std::fprintf(env.err, "detached; job %s keeps running — kiln watch %s to follow it again\n",
                 job_id.c_str(), job_id.c_str());
    return Interrupted();
  }
  if (!status.ok()) {
    view.ClearLine();
    return ServerError(status);
  }
  KILN_ASSIGN_OR_RETURN(job, FetchJob(*c, job_id));
  if (!env.json()) view.PrintSummary(job);
  if (!IsFinal(job.state())) {
    return absl::UnavailableError(absl::StrCat("the event stream of ", job_id,
                                               " ended while it is ", StateName(job.state())));
  }
  if (job.state() != v1::JOB_STATE_SUCCEEDED) {
    if (env.json()) {
      std::fprintf(env.err, "job %s %s: %s\n", job_id.c_str(), StateName(job.state()).c_str(),
                   job.reason().c_str());
    }
    return ReportedFailure();
  }
  return absl::OkStatus();
}

absl::Status Submit(CommandEnv& env, SubmitOptions& o) {
  if (o.spec_file.empty() && o.overrides.preset.empty()) {
    return UsageError("give a spec file (SPEC.json or SPEC.textproto) or --preset");
  }
  v1::JobSpec spec;
  if (!o.spec_file.empty()) {
    KILN_ASSIGN_OR_RETURN(spec, ReadSpecFile(o.spec_file));
  }
  if (o.epochs_opt->count() > 0) o.overrides.epochs = o.epochs;
  if (o.batch_opt->count() > 0) o.overrides.batch_size = o.batch_size;
  if (o.lr_opt->count() > 0) o.overrides.lr = o.lr;
  if (o.seed_opt->count() > 0) o.overrides.seed = o.seed;
  if (o.momentum_opt->count() > 0) o.overrides.momentum = o.momentum;
  if (o.weight_decay_opt->count() > 0) o.overrides.weight_decay = o.weight_decay;
  if (o.workers_opt->count() > 0) o.overrides.workers = o.workers;
  if (o.max_retries_opt->count() > 0) o.overrides.max_retries = o.max_retries;
  KILN_RETURN_IF_ERROR(ApplyOverrides(o.overrides, &spec));

  KILN_ASSIGN_OR_RETURN(Connection * c, env.Connect());
  auto stub = v1::Training::NewStub(c->channel());
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  v1::Job job;
  auto context = c->NewContext();
  grpc::Status status = stub->SubmitJob(context.get(), request, &job);
  if (!status.ok()) return ServerError(status);
  if (env.json()) {
    std::fprintf(env.out, "%s\n", MessageToJson(job, /*pretty=*/!o.watch).c_str());
  } else {
    std::fprintf(env.out, "submitted %s: %s on %s, %s, %d epoch%s, device %s\n", job.id().c_str(),
                 ModelSummary(job.spec()).c_str(), job.spec().dataset().c_str(),
                 absl::StrCat(job.parameter_count(), " parameters").c_str(), job.epochs(),
                 job.epochs() == 1 ? "" : "s", DeviceText(job).c_str());
    if (!o.watch) std::fprintf(env.out, "follow it with: kiln watch %s\n", job.id().c_str());
  }
  std::fflush(env.out);
  if (!o.watch) return absl::OkStatus();
  return WatchJob(env, job.id());
}

// Whether `job` carries every KEY=VALUE (or just KEY) of `labels`.
bool HasLabels(const v1::Job& job, const std::vector<std::string>& labels) {
  for (const std::string& label : labels) {
    const size_t eq = label.find('=');
    const auto it = job.spec().labels().find(label.substr(0, eq));
    if (it == job.spec().labels().end()) return false;
    if (eq != std::string::npos && it->second != label.substr(eq + 1)) return false;
  }
  return true;
}

absl::Status ListJobs(CommandEnv& env, const std::vector<std::string>& states, int limit,
                      const std::vector<std::string>& labels) {
  v1::ListJobsRequest request;
  for (const std::string& s : states) {
    v1::JobState state;
    const std::string name = "JOB_STATE_" + absl::AsciiStrToUpper(s);
    if (!v1::JobState_Parse(name, &state) || state == v1::JOB_STATE_UNSPECIFIED) {
      return UsageError(absl::StrCat("--state: unknown state \"", s,
                                     "\"; expected queued, running, succeeded, failed or "
                                     "cancelled"));
    }
    request.add_states(state);
  }
  KILN_ASSIGN_OR_RETURN(Connection * c, env.Connect());
  auto stub = v1::Training::NewStub(c->channel());
  v1::ListJobsResponse all;
  do {
    if (limit > 0) request.set_page_size(std::min(1000, limit - all.jobs_size()));
    v1::ListJobsResponse page;
    auto context = c->NewContext();
    grpc::Status status = stub->ListJobs(context.get(), request, &page);
    if (!status.ok()) return ServerError(status);
    // Labels are filtered here: kilnd's ListJobs knows states only, and job lists are small.
    for (v1::Job& job : *page.mutable_jobs()) {
      if (HasLabels(job, labels)) *all.add_jobs() = std::move(job);
    }
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty() && (limit <= 0 || all.jobs_size() < limit));
  if (env.json()) {
    PrintJson(env, all);
    return absl::OkStatus();
  }
  if (all.jobs().empty() && !labels.empty()) {
    std::fprintf(env.out, "no jobs with those labels\n");
    return absl::OkStatus();
  }
  if (all.jobs().empty()) {
    std::fprintf(env.out, "no jobs; start one with: kiln submit --preset mnist-mlp --watch\n");
    return absl::OkStatus();
  }
  Table table({"JOB", "NAME", "OWNER", "STATE", "MODEL", "DATASET", "DEVICE", "EPOCHS", "STEP",
               "TEST ACC", "AGE"});
  const absl::Time now = absl::Now();
  for (const v1::Job& job : all.jobs()) {
    table.AddRow(
        {job.id(), job.spec().name().empty() ? "-" : job.spec().name(), OwnerText(job.owner()),
         StateName(job.state()), ModelSummary(job.spec()), job.spec().dataset(), DeviceText(job),
         absl::StrCat(job.epochs_done(), "/", job.epochs()), absl::StrCat(job.global_step()),
         job.epochs_done() > 0 && job.last_epoch().test_samples() > 0
             ? FormatPercent(job.last_epoch().test_accuracy())
             : "-",
         FormatAge(job.create_time(), now)});
  }
  table.Print(env.out);
  return absl::OkStatus();
}

void PrintJob(CommandEnv& env, const v1::Job& job) {
  if (env.json()) {
    PrintJson(env, job);
    return;
  }
  KeyValueList kv;
  kv.Add("job", job.id());
  if (!job.spec().name().empty()) kv.Add("name", job.spec().name());
  if (!job.spec().labels().empty()) kv.Add("labels", LabelsText(job.spec()));
  kv.Add("owner", OwnerText(job.owner()));
  kv.Add("state", StateName(job.state()));
  if (!job.reason().empty()) kv.Add("reason", job.reason());
  kv.Add("model", ModelSummary(job.spec()));
  kv.Add("parameters", absl::StrCat(job.parameter_count()));
  kv.Add("dataset", job.spec().dataset());
  kv.Add("device", job.device());
  kv.Add("precision", job.precision_text().empty() ? "fp32" : job.precision_text());
  kv.Add("priority", absl::StrCat(PriorityWord(job.spec().priority()),
                                  job.spec().non_preemptible() ? " (never preempted)" : ""));
  if (job.spec().workers() > 1 || job.spec().external_workers()) {
    kv.Add("workers", absl::StrCat(std::max(1, job.spec().workers()), job.spec().external_workers()
                                                                          ? " (started elsewhere)"
                                                                          : " (started by kilnd)"));
    kv.Add("retries", absl::StrCat(job.retries(), " of ", job.spec().max_retries()));
  }
  AddSpecDetails(job.spec(), job.resolved_spec(), &kv);
  kv.Add("epochs", absl::StrCat(job.epochs_done(), " of ", job.epochs(), " done"));
  kv.Add("steps", absl::StrCat(job.global_step()));
  if (job.epochs_done() > 0) {
    kv.Add("last epoch",
           ProgressView::EpochLine(job.last_epoch(), job.epochs(), job.spec().max_iters(),
                                   job.spec().eval_interval()));
    if (job.last_epoch().test_samples() > 0) {
      kv.Add("best test acc", FormatPercent(job.best_test_accuracy()));
    }
  }
  kv.Add("attempts", absl::StrCat(job.attempts()));
  if (job.resumed_from_step() > 0)
    kv.Add("resumed from", absl::StrCat("step ", job.resumed_from_step()));
  kv.Add("created", FormatTime(job.create_time()));
  kv.Add("started", FormatTime(job.start_time()));
  kv.Add("ended", FormatTime(job.end_time()));
  kv.Print(env.out);
}

absl::Status PrintWorkerToken(CommandEnv& env, const std::string& job_id) {
  KILN_ASSIGN_OR_RETURN(Connection * c, env.Connect());
  auto stub = v1::Training::NewStub(c->channel());
  v1::GetWorkerTokenRequest request;
  request.set_job_id(job_id);
  v1::GetWorkerTokenResponse response;
  auto context = c->NewContext();
  grpc::Status status = stub->GetWorkerToken(context.get(), request, &response);
  if (!status.ok()) return ServerError(status);
  if (env.json()) {
    PrintJson(env, response);
  } else {
    std::fprintf(env.out, "%s\n", response.token().c_str());
  }
  return absl::OkStatus();
}

absl::Status GetJobCommand(CommandEnv& env, const std::string& job_id) {
  KILN_ASSIGN_OR_RETURN(Connection * c, env.Connect());
  KILN_ASSIGN_OR_RETURN(v1::Job job, FetchJob(*c, job_id));
  PrintJob(env, job);
  return absl::OkStatus();
}

absl::Status Cancel(CommandEnv& env, const std::string& job_id) {
  KILN_ASSIGN_OR_RETURN(Connection * c, env.Connect());
  auto stub = v1::Training::NewStub(c->channel());
  v1::CancelJobRequest request;
  request.set_job_id(job_id);
  v1::Job job;
  auto context = c->NewContext();
  grpc::Status status = stub->CancelJob(context.get(), request, &job);
  if (!status.ok()) return ServerError(status);
  if (env.json()) {
    PrintJson(env, job);
  } else {
    std::fprintf(env.out, "cancelling %s (%s); resume it later with: kiln resume %s\n",
                 job.id().c_str(), StateName(job.state()).c_str(), job.id().c_str());
  }
  return absl::OkStatus();
}

absl::Status Resume(CommandEnv& env, const std::string& job_id, int epochs, int64_t checkpoint_id,
                    bool watch) {
  KILN_ASSIGN_OR_RETURN(Connection * c, env.Connect());
  auto stub = v1::Training::NewStub(c->channel());
  v1::ResumeJobRequest request;
  request.set_job_id(job_id);
  request.set_epochs(epochs);
  request.set_checkpoint_id(checkpoint_id);
  v1::Job job;
  auto context = c->NewContext();
  grpc::Status status = stub->ResumeJob(context.get(), request, &job);
  if (!status.ok()) return ServerError(status);
  if (env.json()) {
    std::fprintf(env.out, "%s\n", MessageToJson(job, /*pretty=*/!watch).c_str());
  } else {
    std::fprintf(env.out, "resumed %s (%s), %d of %d epochs done\n", job.id().c_str(),
                 StateName(job.state()).c_str(), job.epochs_done(), job.epochs());
  }
  std::fflush(env.out);
  return watch ? WatchJob(env, job_id) : absl::OkStatus();
}

void AddSubmitCommand(CLI::App& app, CommandEnv& env, Action* action) {
  auto submit = std::make_shared<SubmitOptions>();
  CLI::App* s = app.add_subcommand("submit", "Submit a training job");
  s->add_option("spec", submit->spec_file,
                "Job spec file: SPEC.json (proto3 JSON of kiln.v1.JobSpec) or SPEC.textproto");
  s->add_option("--preset", submit->overrides.preset, "Start from a preset model and optimizer")
      ->check(CLI::IsMember({"mnist-mlp", "mnist-cnn"}));
  s->add_option("--dataset", submit->overrides.dataset,
                "Dataset name on the server (default: the spec's, else mnist)");
  submit->epochs_opt = s->add_option("--epochs", submit->epochs, "Epochs to train (default 1)")
                           ->check(CLI::Range(1, 10000));
  s->add_option("--max-iters", submit->overrides.max_iters,
                "A language model's run: iterations to train (instead of epochs)")
      ->check(CLI::PositiveNumber);
  s->add_option("--eval-interval", submit->overrides.eval_interval,
                "A language model's run: iterations between validation losses")
      ->check(CLI::PositiveNumber);
  submit->batch_opt = s->add_option("--batch-size", submit->batch_size, "Samples per batch")
                          ->check(CLI::Range(1, 65536));
  s->add_option("--optimizer", submit->overrides.optimizer,
                "Optimizer: sgd, adam or adamw (another kind than the spec's starts afresh, "
                "keeping the rate and weight decay)");
  submit->lr_opt = s->add_option("--lr", submit->lr, "Learning rate")->check(CLI::PositiveNumber);
  submit->momentum_opt = s->add_option("--momentum", submit->momentum, "SGD momentum in [0, 1)")
                             ->check(CLI::Range(0.0, 1.0));
  submit->weight_decay_opt =
      s->add_option("--weight-decay", submit->weight_decay, "Weight decay, >= 0")
          ->check(CLI::NonNegativeNumber);
  s->add_option("--schedule", submit->overrides.schedule,
                "Learning-rate schedule: KIND[:FIELD=VALUE,...] with KIND constant, step, cosine, "
                "one_cycle or warmup_cosine and FIELDs of ScheduleSpec (step_size, gamma, t_max, "
                "eta_min, pct_start, anneal, warmup_iters, lr_decay_iters, ...)");
  submit->seed_opt = s->add_option("--seed", submit->seed, "Seed of initialisation and shuffling");
  s->add_option("--device", submit->overrides.device,
                "Device: cpu, cuda:N or auto (default: the daemon's --device)");
  s->add_option("--precision", submit->overrides.precision,
                "fp32 (default), tf32: TF32 tensor cores for GEMMs and convolutions on CUDA "
                "(a CPU has none and trains as fp32), or bf16: GEMMs with bfloat16 inputs and "
                "float32 accumulation on either backend, the rest (convolutions, weights, "
                "optimizer, checkpoints) float32");
  s->add_option("--priority", submit->overrides.priority,
                "low, normal (default) or high: each device's queue runs higher priorities "
                "first, and a high job preempts a lower one that holds its device (which "
                "checkpoints and resumes later, to the same bits)");
  s->add_flag("--non-preemptible", submit->overrides.non_preemptible,
              "Never preempted by a higher-priority job (admins only)");
  s->add_option("--name", submit->overrides.name,
                "A display name for the job (kiln jobs shows it; the id stays the key)");
  s->add_option("--label", submit->overrides.labels,
                "KEY=VALUE to find the job by (kiln jobs --label); repeatable")
      ->allow_extra_args(false);
  submit->workers_opt =
      s->add_option("--workers", submit->workers,
                    "Data-parallel workers (processes, one rank each; default 1: in kilnd)")
          ->check(CLI::Range(1, 64));
  submit->max_retries_opt =
      s->add_option("--max-retries", submit->max_retries,
                    "Times a job of several workers starts again from its latest checkpoint "
                    "after a worker fails (default 0)")
          ->check(CLI::Range(0, 100));
  s->add_flag("--external-workers", submit->overrides.external_workers,
              "Wait for workers started elsewhere (kiln-worker --job ID --rank R; token from "
              "kiln worker-token) instead of starting them");
  s->add_flag("--watch,-w", submit->watch, "Follow the job's progress until it ends");
  s->footer(
      "Examples:\n"
      "  kiln submit --preset mnist-cnn --epochs 1 --watch\n"
      "  kiln submit --preset mnist-mlp --epochs 5 --lr 0.01 --device cuda:0\n"
      "  kiln submit --preset mnist-mlp --optimizer adamw --lr 3e-4 --weight-decay 0.01\n"
      "  kiln submit --preset mnist-cnn --epochs 10 --schedule cosine\n"
      "  kiln submit --preset mnist-cnn --epochs 10 --schedule step:step_size=3,gamma=0.5\n"
      "  kiln submit my-model.json --dataset fashion-mnist --name baseline --label team=vision\n"
      "  kiln submit my-model.textproto --watch --output json\n"
      "  kiln submit --preset mnist-cnn --workers 2 --device cpu --max-retries 1 --watch");
  s->callback(
      [&env, action, submit] { *action = [&env, submit] { return Submit(env, *submit); }; });
}

void AddWatchCommand(CLI::App& app, CommandEnv& env, Action* action) {
  auto watch_id = std::make_shared<std::string>();
  CLI::App* w = app.add_subcommand("watch", "Follow a job's progress until it ends");
  w->add_option("job", *watch_id, "Job id")->required();
  w->footer(
      "Draws a live progress bar on a terminal and plain lines otherwise; with --output json\n"
      "prints each event as one JSON line. Ctrl-C detaches and leaves the job running.\n"
      "Exits 1 when the job FAILED or was CANCELLED.\n\n"
      "Examples:\n"
      "  kiln watch job-3f9c2a1b7d04\n"
      "  kiln watch job-3f9c2a1b7d04 --output json | jq -c .epoch");
  w->callback([&env, action, watch_id] {
    *action = [&env, watch_id] { return WatchJob(env, *watch_id); };
  });
}

void AddJobsCommand(CLI::App& app, CommandEnv& env, Action* action) {
  auto states = std::make_shared<std::vector<std::string>>();
  auto limit = std::make_shared<int>(0);
  auto labels = std::make_shared<std::vector<std::string>>();
  CLI::App* j = app.add_subcommand("jobs", "List jobs, newest first");
  j->add_option("--state", *states, "Only jobs in these states (queued, running, ...)")
      ->delimiter(',');
  j->add_option("--label", *labels,
                "Only jobs with this label: KEY=VALUE, or KEY for any value; repeatable (all "
                "must match)")
      ->allow_extra_args(false);
  j->add_option("--limit", *limit, "At most this many jobs (default all)")
      ->check(CLI::NonNegativeNumber);
  j->footer(
      "Examples:\n"
      "  kiln jobs\n"
      "  kiln jobs --state running,queued\n"
      "  kiln jobs --label team=vision --label baseline\n"
      "  kiln jobs --output json | jq -r '.jobs[].id'");
  j->callback([&env, action, states, limit, labels] {
    *action = [&env, states, limit, labels] { return ListJobs(env, *states, *limit, *labels); };
  });
}

void AddWorkerTokenCommand(CLI::App& app, CommandEnv& env, Action* action) {
  auto token_id = std::make_shared<std::string>();
  CLI::App* t = app.add_subcommand("worker-token", "Print the token a job's workers present");
  t->add_option("job", *token_id, "Job id (a job of several workers)")->required();
  t->footer(
      "For workers started elsewhere (kiln submit --external-workers): give it to each\n"
      "kiln-worker as KILN_WORKER_TOKEN, e.g. through a Kubernetes secret. It stays the job's\n"
      "across retries and restarts of kilnd. Anyone holding it can act as the job's workers.\n\n"
      "Example:\n"
      "  kubectl create secret generic kiln-worker-token \\\n"
      "      --from-literal=token=$(kiln worker-token job-3f9c2a1b7d04)");
  t->callback([&env, action, token_id] {
    *action = [&env, token_id] { return PrintWorkerToken(env, *token_id); };
  });
}

void AddGetCommand(CLI::App& app, CommandEnv& env, Action* action) {
  auto get_id = std::make_shared<std::string>();
  CLI::App* g = app.add_subcommand("get", "Show one job");
  g->add_option("job", *get_id, "Job id")->required();
  g->footer(
      "Examples:\n"
      "  kiln get job-3f9c2a1b7d04\n"
      "  kiln get job-3f9c2a1b7d04 --output json | jq .state");
  g->callback(
      [&env, action, get_id] { *action = [&env, get_id] { return GetJobCommand(env, *get_id); }; });
}

void AddCancelCommand(CLI::App& app, CommandEnv& env, Action* action) {
  auto cancel_id = std::make_shared<std::string>();
  CLI::App* c = app.add_subcommand("cancel", "Cancel a queued or running job");
  c->add_option("job", *cancel_id, "Job id")->required();
  c->footer(
      "A running job stops after its current step.\n\nExample:\n  kiln cancel job-3f9c2a1b7d04");
  c->callback([&env, action, cancel_id] {
    *action = [&env, cancel_id] { return Cancel(env, *cancel_id); };
  });
}

void AddResumeCommand(CLI::App& app, CommandEnv& env, Action* action) {
  auto resume_id = std::make_shared<std::string>();
  auto resume_epochs = std::make_shared<int>(0);
  auto resume_watch = std::make_shared<bool>(false);
  auto resume_from = std::make_shared<int64_t>(0);
  CLI::App* r = app.add_subcommand("resume", "Resume a cancelled, failed or finished job");
  r->add_option("job", *resume_id, "Job id")->required();
  r->add_option("--epochs", *resume_epochs, "New total epoch count (default: unchanged)")
      ->check(CLI::Range(1, 10000));
  r->add_option("--checkpoint", *resume_from,
                "Continue from this checkpoint id (default: the newest that verifies)")
      ->check(CLI::NonNegativeNumber);
  r->add_flag("--watch,-w", *resume_watch, "Follow the job's progress until it ends");
  r->footer(
      "Continues from the job's latest checkpoint.\n\n"
      "Examples:\n"
      "  kiln resume job-3f9c2a1b7d04 --watch\n"
      "  kiln resume job-3f9c2a1b7d04 --epochs 10\n"
      "  kiln resume job-3f9c2a1b7d04 --checkpoint 3 --epochs 10");
  r->callback([&env, action, resume_id, resume_epochs, resume_from, resume_watch] {
    *action = [&env, resume_id, resume_epochs, resume_from, resume_watch] {
      return Resume(env, *resume_id, *resume_epochs, *resume_from, *resume_watch);
    };
  });
}

}  // namespace

void AddJobCommands(CLI::App& app, CommandEnv& env, Action* action) {
  // In this order in kiln --help.
  AddSubmitCommand(app, env, action);
  AddWatchCommand(app, env, action);
  AddJobsCommand(app, env, action);
  AddWorkerTokenCommand(app, env, action);
  AddGetCommand(app, env, action);
  AddCancelCommand(app, env, action);
  AddResumeCommand(app, env, action);
}

}  // namespace kiln::client
