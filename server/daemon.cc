#include "server/daemon.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_interceptor.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/shown_paths.h"
#include "common/status_macros.h"
#include "engine/backend_registry.h"
#include "grpc/health/v1/health.pb.h"
#include "server/grpc/auth_interceptor.h"
#include "server/grpc/call_auth.h"
#include "server/grpc/metrics_interceptor.h"
#include "server/grpc/training_service.h"
#include "server/grpc/workers_service.h"
#include "server/http/route_label.h"
#include "server/jobs/interrupted_writes.h"
#include "server/serving/job_checkpoint_resolver.h"
#include "server/serving/rest_generation.h"
#include "server/serving/rest_inference.h"
#include "server/web/web_page.h"

namespace kiln::server {

// Checkpoints recorded before serving exists, or after it stops, have no follower to tell.
class Daemon::CheckpointFollowObserver final : public JobEventObserver {
 public:
  void Attach(serving::ModelFollower* follower) { follower_.store(follower); }
  void OnCheckpoint(const v1::Checkpoint& checkpoint, double /*seconds*/) override {
    if (serving::ModelFollower* f = follower_.load()) f->CheckpointWritten(checkpoint.job_id());
  }

 private:
  std::atomic<serving::ModelFollower*> follower_{nullptr};
};
namespace {

constexpr const char* kServiceName = "kiln.v1.Training";
constexpr const char* kInferenceServiceName = "inference.GRPCInferenceService";

absl::Status MakeDir(const std::string& flag, const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, " is required"));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--", flag, "=", dir, ": cannot create: ", ec.message()));
  }
  return absl::OkStatus();
}

// "host:0" with the port actually bound.
std::string WithPort(const std::string& listen, int port) {
  const size_t colon = listen.rfind(':');
  return absl::StrCat(colon == std::string::npos ? listen : listen.substr(0, colon), ":", port);
}

// Where kilnd's own workers reach it: the listen address, or loopback when it listens on all.
std::string LocalAddressFor(const std::string& listen, int port) {
  const size_t colon = listen.rfind(':');
  std::string host = colon == std::string::npos ? listen : listen.substr(0, colon);
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "localhost") {
    host = "127.0.0.1";
  }
  return absl::StrCat(host, ":", port);
}

// kiln-worker is installed beside kilnd (build/server, /usr/local/bin in the image).
std::string WorkerBinaryBesideKilnd() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "kiln-worker";
  return (self.parent_path() / "kiln-worker").string();
}

int ClampedMillis(absl::Duration d) {
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(d), INT32_MAX));
}

// The limits and sizes a client or the machine bounds; raises the open-file limit to its hard
// limit on the way.
absl::Status CheckLimits(const DaemonOptions& options) {
  if (options.team_quota.max_running_jobs < 0 || options.team_quota.max_gpus < 0 ||
      options.team_max_storage_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--team_max_running_jobs, --team_max_gpus and --team_max_storage_bytes: must be 0 (no "
        "limit) or more, got ",
        options.team_quota.max_running_jobs, ", ", options.team_quota.max_gpus, " and ",
        options.team_max_storage_bytes));
  }
  // Every limit must let something through; a zero would refuse all work in confusing ways.
  const std::pair<const char*, int64_t> limits[] = {
      {"max_queued_jobs", options.max_queued_jobs},
      {"max_upload_bytes", options.max_upload_bytes},
      {"max_message_bytes", options.max_message_bytes},
      {"max_streams", options.max_streams},
      {"max_health_watches", options.max_health_watches},
      {"metrics_max_ended_jobs", options.metrics_max_ended_jobs},
      {"max_connections", options.max_connections},
      {"max_inference_batch", options.max_inference_batch},
      {"max_deploy_batch_size", options.max_deploy_batch_size},
      {"max_layers", options.limits.max_layers},
      {"max_parameters", options.limits.max_parameters},
      {"max_activation_bytes", options.limits.max_activation_bytes},
      {"max_job_memory_bytes", options.limits.max_job_memory_bytes},
      {"max_serving_memory_bytes", options.max_serving_memory_bytes},
      {"max_epochs", options.limits.max_epochs},
      {"max_batch_size", options.limits.max_batch_size},
      {"max_epoch_events_per_job", options.max_epoch_events_per_job},
      {"max_rendezvous_waiters_per_job", options.worker_limits.max_key_waiters_per_job},
      {"max_rendezvous_bytes_per_job", options.worker_limits.max_key_bytes_per_job},
      {"max_rendezvous_bytes", options.worker_limits.max_key_bytes},
  };
  for (const auto& [flag, value] : limits) {
    if (value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": must be at least 1, got ", value));
    }
  }
  KILN_RETURN_IF_ERROR(http::ValidateHttpLimits(options.http_limits));
  if (options.reserved_descriptors < 0) {
    return absl::InvalidArgumentError("--reserved_descriptors: must be at least 0");
  }
  for (const auto& [flag, value] :
       {std::pair<const char*, absl::Duration>{"connection_handshake_timeout",
                                               options.connection_handshake_timeout},
        {"connection_idle_timeout", options.connection_idle_timeout},
        {"worker_heartbeat_timeout", options.worker_heartbeat_timeout}}) {
    if (value < absl::Milliseconds(1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": must be at least 1ms, got ", absl::FormatDuration(value)));
    }
  }
  // Descriptors: as many as the hard limit allows, some always kept for files.
  const int open_file_limit = RaiseOpenFileLimit();
  if (options.reserved_descriptors >= open_file_limit / 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--reserved_descriptors: ", options.reserved_descriptors,
        " leaves too few of the open-file limit (", open_file_limit, ") for connections"));
  }
  if (options.max_step_events_per_job < JobStore::kMinStepEventsPerJob) {
    return absl::InvalidArgumentError(absl::StrCat("--max_step_events_per_job: must be at least ",
                                                   JobStore::kMinStepEventsPerJob, ", got ",
                                                   options.max_step_events_per_job));
  }
  if (options.watch_replay_page_events < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "watch_replay_page_events: must be at least 1, got ", options.watch_replay_page_events));
  }
  // Each web event stream or download holds an HTTP thread for its life: at most half of them,
  // so REST inference and the page always have the rest.
  if (const int most = http::HttpServerOptions{}.threads / 2;
      options.max_web_long_answers < 1 || options.max_web_long_answers > most) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_web_streams: must be in [1, ", most, "] (half the HTTP port's ",
                     most * 2, " threads), got ", options.max_web_long_answers));
  }
  // A REST generation holds an HTTP thread while it runs, as a web stream does.
  if (const int most = http::HttpServerOptions{}.threads / 2;
      options.max_generations < 1 || options.max_generations > most) {
    return absl::InvalidArgumentError(absl::StrCat("--max_generations: must be in [1, ", most,
                                                   "], got ", options.max_generations));
  }
  if (options.web_stream_max_duration < absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--web_stream_max_duration: must be at least 1s, got ",
                     absl::FormatDuration(options.web_stream_max_duration)));
  }
  return absl::OkStatus();
}

// The flags, all checked before anything is opened or bound; makes the state and data folders.
absl::Status CheckOptions(const DaemonOptions& options) {
  KILN_RETURN_IF_ERROR(MakeDir("state_dir", options.state_dir));
  KILN_RETURN_IF_ERROR(MakeDir("data_dir", options.data_dir));
  if (options.device != "auto") {
    absl::Status device = ValidateDevice(options.device);
    if (!device.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--device: ", device.message()));
    }
  }
  if (options.max_crash_resumes < 0) {
    return absl::InvalidArgumentError("--max_crash_resumes: must be at least 0");
  }
  if (options.max_jobs_per_device < 1) {
    return absl::InvalidArgumentError("--max_jobs_per_device: must be at least 1");
  }
  return CheckLimits(options);
}

// Clients see paths under these folders by the folders' names, not the server's layout.
void ShowPathsByFolderName(const DaemonOptions& options) {
  std::vector<std::pair<std::string, std::string>> roots;
  for (const auto& [dir, name] :
       {std::pair<std::string, const char*>{options.state_dir, "$state_dir"},
        {options.data_dir, "$data_dir"}}) {
    roots.emplace_back(dir, name);
    std::error_code ec;
    const std::string absolute = std::filesystem::absolute(dir, ec).lexically_normal().string();
    if (!ec && absolute != dir) roots.emplace_back(absolute, name);
  }
  SetShownPathRoots(std::move(roots));
}

// How kilnd starts the workers of a job of several: its own kiln-worker processes, with the TLS
// flags they need to reach it (or why it cannot start them, when it serves TLS without them).
WorkerRunnerOptions LocalWorkerOptions(const DaemonOptions& options, WorkerRegistry* registry) {
  WorkerRunnerOptions workers;
  workers.state_dir = options.state_dir;
  workers.data_dir = options.data_dir;
  workers.worker_binary =
      options.worker_binary.empty() ? WorkerBinaryBesideKilnd() : options.worker_binary;
  workers.registry = registry;
  workers.join_timeout = options.worker_join_timeout;
  workers.external_join_timeout = options.external_worker_join_timeout;
  workers.heartbeat_timeout = options.worker_heartbeat_timeout;
  workers.cpu_threads = CpuBackendThreads({0, std::max(1, options.max_jobs_per_device)});
  workers.step_delay = options.step_delay;
  const TlsMode tls_mode = TlsModeOf(options.tls);
  if (tls_mode == TlsMode::kOff) return workers;
  if (options.worker_tls_ca.empty()) {
    workers.local_workers_refusal =
        "kilnd serves TLS (--tls_cert), and the workers it would start cannot verify it: start "
        "kilnd with --worker_tls_ca (the CA that signed its certificate), or start the job's "
        "workers elsewhere (external_workers)";
  } else if (tls_mode == TlsMode::kMutualTls &&
             (options.worker_tls_cert.empty() || options.worker_tls_key.empty())) {
    workers.local_workers_refusal =
        "kilnd asks clients for certificates (--tls_client_ca): start it with "
        "--worker_tls_cert and --worker_tls_key for the workers it starts, or start the job's "
        "workers elsewhere (external_workers)";
  }
  for (const auto& [flag, value] :
       {std::pair<const char*, const std::string*>{"--tls_ca", &options.worker_tls_ca},
        {"--tls_server_name", &options.worker_tls_server_name},
        {"--tls_cert", &options.worker_tls_cert},
        {"--tls_key", &options.worker_tls_key}}) {
    if (value->empty()) continue;
    workers.worker_args.push_back(flag);
    workers.worker_args.push_back(*value);
  }
  return workers;
}

}  // namespace

// The order matters: each phase uses what the ones before it made, and Shutdown and ~Daemon undo
// them in reverse (daemon.h declares the members in that order).
absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& options) {
  KILN_RETURN_IF_ERROR(CheckOptions(options));
  ShowPathsByFolderName(options);
  std::unique_ptr<Daemon> d(new Daemon());
  d->options_ = options;
  d->log_ = std::make_unique<EventLog>(options.log_format, options.log_stream);
  KILN_RETURN_IF_ERROR(d->LockStateDir());
  d->metrics_ = std::make_unique<Metrics>(
      MetricsOptions{options.metrics_job_retention, options.metrics_max_ended_jobs, {}});
  KILN_RETURN_IF_ERROR(d->StartSecurity());
  KILN_RETURN_IF_ERROR(d->OpenStore());
  KILN_RETURN_IF_ERROR(d->StartJobs());
  d->StartServing();
  KILN_ASSIGN_OR_RETURN(std::vector<serving::DeploymentRecord> to_restore,
                        d->DeploymentsToRestore());
  KILN_RETURN_IF_ERROR(d->StartHttp());
  KILN_RETURN_IF_ERROR(d->StartGrpc());
  d->AnnounceServing();
  if (!to_restore.empty()) {
    d->restore_thread_ = std::thread(
        [raw = d.get(), records = std::move(to_restore)] { raw->RestoreModels(records); });
  }
  return d;
}

absl::Status Daemon::LockStateDir() {
  KILN_ASSIGN_OR_RETURN(state_dir_lock_, StateDirLock::Acquire(options_.state_dir));
  // A kilnd killed mid-write left these; with the lock held, no other daemon is writing here.
  const InterruptedWrites swept = RemoveInterruptedWrites(options_.state_dir, options_.data_dir);
  if (swept.checkpoint_temps > 0 || swept.upload_dirs > 0) {
    log_->Log(
        LogLevel::kInfo, "interrupted_writes_removed",
        {{"checkpoint_temp_files", swept.checkpoint_temps}, {"upload_dirs", swept.upload_dirs}});
  }
  return absl::OkStatus();
}

// Security settings are checked before anything is opened or bound.
absl::Status Daemon::StartSecurity() {
  if (TlsModeOf(options_.tls) != TlsMode::kOff) {
    if (options_.tls_reload_interval < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls_reload_interval: must not be negative, got ",
                       absl::FormatDuration(options_.tls_reload_interval)));
    }
    // kilnd's own copies of the files, which only ever hold a sound set
    // (server/grpc/tls_reloader.h).
    KILN_ASSIGN_OR_RETURN(
        tls_, TlsReloader::Start(options_.tls, options_.state_dir + "/tls",
                                 options_.tls_reload_interval, log_.get(), metrics_.get()));
  }
  if (!options_.auth_tokens_file.empty()) {
    KILN_ASSIGN_OR_RETURN(auth_tokens_, AuthTokens::Load(options_.auth_tokens_file));
    LogBareTokens();
  }
  return absl::OkStatus();
}

absl::Status Daemon::OpenStore() {
  KILN_ASSIGN_OR_RETURN(
      store_, JobStore::Open(options_.state_dir + "/kiln.db", {options_.max_step_events_per_job,
                                                               options_.max_epoch_events_per_job}));
  // Before any job resumes and writes: with the lock held, every checkpoint here is ours.
  if (const int unrecorded = RemoveUnrecordedCheckpoints(options_.state_dir, *store_);
      unrecorded > 0) {
    log_->Log(LogLevel::kInfo, "unrecorded_checkpoints_removed", {{"files", unrecorded}});
  }
  return absl::OkStatus();
}

absl::Status Daemon::StartJobs() {
  broadcaster_ = std::make_unique<MetricBroadcaster>(options_.watch_buffer_events);
  datasets_ = std::make_unique<DatasetCatalog>(options_.data_dir, options_.max_upload_bytes);
  JobManagerOptions manager_options;
  manager_options.state_dir = options_.state_dir;
  manager_options.default_device = options_.device;
  manager_options.max_jobs_per_device = options_.max_jobs_per_device;
  manager_options.max_crash_resumes = options_.max_crash_resumes;
  manager_options.max_queued_jobs = options_.max_queued_jobs;
  manager_options.team_quota = options_.team_quota;
  manager_options.on_preempt = [metrics = metrics_.get(), log = log_.get()](
                                   const v1::Job& preempted, const v1::Job& waiting) {
    metrics->JobPreempted(preempted);
    log->Log(LogLevel::kInfo, "job_preempted",
             {{"job", preempted.id()},
              {"priority", PriorityName(preempted.spec().priority())},
              {"by", waiting.id()},
              {"by_priority", PriorityName(waiting.spec().priority())}});
  };
  manager_options.limits = options_.limits;
  manager_options.step_delay = options_.step_delay;
  manager_options.on_store_writable = [this](bool writable) { StoreWritable(writable); };
  manager_options.replay_page_events = options_.watch_replay_page_events;
  // Job events reach the metric families and the event log through these, and only these.
  job_metrics_ = std::make_unique<JobMetricsObserver>(metrics_.get());
  job_log_ = std::make_unique<JobLogObserver>(log_.get());
  follow_observer_ = std::make_unique<CheckpointFollowObserver>();
  jobs_feed_ = std::make_unique<web::JobsFeed>();
  manager_options.observers = {job_metrics_.get(), job_log_.get(), follow_observer_.get(),
                               jobs_feed_.get()};
  // Jobs of several workers: a key in the state dir makes each job's worker token, so tokens
  // handed to workers elsewhere stay good across restarts.
  KILN_ASSIGN_OR_RETURN(const std::string worker_key,
                        LoadOrCreateWorkerKey(options_.state_dir + "/worker-token.key"));
  worker_registry_ = std::make_unique<WorkerRegistry>(worker_key, options_.worker_limits);
  manager_options.workers = LocalWorkerOptions(options_, worker_registry_.get());
  manager_ = std::make_unique<JobManager>(store_.get(), broadcaster_.get(), datasets_.get(),
                                          manager_options);
  KILN_RETURN_IF_ERROR(manager_->Recover());
  audit_ = std::make_unique<AuditLog>(log_.get());
  JobAccessOptions access_options;
  access_options.team_max_storage_bytes = options_.team_max_storage_bytes;
  access_options.on_storage_refusal = [metrics = metrics_.get()](const std::string& team) {
    metrics->QuotaRefused(team, "storage");
  };
  access_ = std::make_unique<JobAccess>(manager_.get(), datasets_.get(), audit_.get(),
                                        std::move(access_options));
  service_ = std::make_unique<TrainingService>(access_.get(), datasets_.get(), broadcaster_.get(),
                                               options_.max_streams, auth_tokens_ != nullptr);
  workers_service_ =
      std::make_unique<WorkersService>(worker_registry_.get(), manager_.get(), datasets_.get(),
                                       options_.state_dir, options_.limits.max_job_memory_bytes);
  return absl::OkStatus();
}

// What the inference service reports to and asks of the rest of kilnd: metrics, the event log,
// the access rules, the audit log and the store of deployments.
serving::InferenceServiceOptions Daemon::InferenceOptions() {
  serving::InferenceServiceOptions inference;
  inference.max_request_samples = options_.max_inference_batch;
  inference.default_deployment.device = options_.device;
  Metrics* metrics = metrics_.get();
  EventLog* log = log_.get();
  inference.on_infer = [metrics](const std::string& model, const std::string& version,
                                 absl::StatusCode code, double seconds, double queue_seconds,
                                 int batch_size) {
    metrics->RecordInference(model, version, code, seconds, queue_seconds, batch_size);
  };
  inference.on_repository_change = [metrics, log](const std::string& model,
                                                  const std::string& source, bool loaded) {
    if (loaded) {
      log->Log(LogLevel::kInfo, "model_deployed", {{"model", model}, {"source", source}});
    } else {
      metrics->ForgetInferenceModel(model);
      log->Log(LogLevel::kInfo, "model_undeployed", {{"model", model}});
    }
  };
  // Deployments come from a job the caller's team may change; each load and unload is audited.
  inference.check_source = [access = access_.get()](const Caller& caller,
                                                    const std::string& source) {
    return access->MayDeployFrom(caller, source);
  };
  inference.audit = [audit = audit_.get()](const Caller& caller, Action action,
                                           const std::string& object, const absl::Status& outcome) {
    audit->Record(caller, action, object, outcome);
  };
  // Deployments are recorded on every change and loaded again at start.
  inference.record_deployments = [store = store_.get()](
                                     const std::string& model,
                                     const std::vector<serving::DeploymentRecord>& versions) {
    std::vector<StoredDeployment> rows;
    for (const serving::DeploymentRecord& v : versions) {
      rows.push_back({v.model, v.version, v.request.SerializeAsString()});
    }
    return store->SetModelDeployments(model, rows);
  };
  // Each deployment restored at start is marked in the store while it loads: a start killed
  // while loading one (out of memory) leaves the mark, and the next start does not load it
  // again (DeploymentsToRestore). An explicit load or unload writes the model's rows unmarked.
  inference.note_restore = [store = store_.get(), log](const serving::DeploymentRecord& record,
                                                       serving::RestorePhase phase) {
    const absl::Status noted = phase == serving::RestorePhase::kLoading
                                   ? store->MarkDeploymentRestoring(record.model, record.version)
                                   : store->ClearDeploymentRestoring(record.model, record.version);
    if (noted.ok()) return;
    // Loaded all the same: serving what was deployed comes before the guard against a crash.
    log->Log(LogLevel::kWarning, "model_restore_unnoted",
             {{"model", record.model},
              {"version", record.version},
              {"reason", std::string(noted.message())}});
  };
  return inference;
}

void Daemon::StartServing() {
  // Serving: deployments name a job's checkpoint ("JOB@best"), resolved through the manager.
  serving::ModelRepositoryOptions models;
  models.resolver = serving::MakeJobCheckpointResolver(
      [m = manager_.get()](const std::string& job) { return m->ListCheckpoints(job); });
  // A served version belongs to the team of the job it was trained by.
  models.sees_source = [access = access_.get()](const Caller& caller, const std::string& source) {
    return access->SeesModelSource(caller, source);
  };
  models.max_batch_size_limit = options_.max_deploy_batch_size;
  models.max_memory_bytes = options_.limits.max_job_memory_bytes;
  models.max_total_memory_bytes = options_.max_serving_memory_bytes;
  models_ = std::make_unique<serving::ModelRepository>(std::move(models));
  Metrics* metrics = metrics_.get();
  EventLog* log = log_.get();
  inference_ = std::make_unique<serving::InferenceService>(models_.get(), InferenceOptions());
  generation_ = std::make_unique<serving::GenerationService>(
      models_.get(),
      serving::GenerationOptions{options_.max_generations, options_.web_stream_max_duration});
  generation_grpc_ = std::make_unique<serving::GenerationGrpcService>(generation_.get());
  // Unset in ~Daemon, before models_ goes: /metrics is served until metrics_ goes.
  metrics->SetInferenceQueueSource([models = models_.get()] {
    std::vector<InferenceQueueDepth> depths;
    for (const serving::VersionQueue& q : models->Queues()) {
      depths.push_back({q.model, q.version, q.queued_requests});
    }
    return depths;
  });
  follower_ = std::make_unique<serving::ModelFollower>(
      models_.get(), inference_.get(), models_->options().resolver,
      [log](const std::string& model, const std::string& source, const absl::Status& outcome) {
        if (outcome.ok()) {
          log->Log(LogLevel::kInfo, "model_followed", {{"model", model}, {"source", source}});
        } else {
          log->Log(
              LogLevel::kError, "model_follow_failed",
              {{"model", model}, {"source", source}, {"reason", std::string(outcome.message())}});
        }
      });
  follow_observer_->Attach(follower_.get());
}

absl::StatusOr<std::vector<serving::DeploymentRecord>> Daemon::DeploymentsToRestore() {
  KILN_ASSIGN_OR_RETURN(std::vector<StoredDeployment> stored, store_->Deployments());
  std::vector<serving::DeploymentRecord> to_restore;
  for (StoredDeployment& row : stored) {
    serving::DeploymentRecord record{row.model, row.version, {}, row.restoring};
    if (!record.request.ParseFromString(row.load_request)) {
      models_->MarkUnavailable(row.model, row.version,
                               "its record in the store is unreadable; deploy it again");
      continue;
    }
    to_restore.push_back(std::move(record));
  }
  if (!to_restore.empty()) {
    models_restored_ = false;
    inference_->SetReady(false);
  }
  return to_restore;
}

absl::Status Daemon::StartGrpc() {
  // Our own grpc.health.v1 (server/grpc/health_service.h): Watch streams are capped.
  grpc::EnableDefaultHealthCheckService(false);
  health_service_ = std::make_unique<HealthService>(options_.max_health_watches);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.RegisterService(health_service_.get());
  builder.AddListeningPort(
      options_.listen, tls_ == nullptr ? grpc::InsecureServerCredentials() : tls_->credentials(),
      &port_);
  builder.RegisterService(service_.get());
  builder.RegisterService(inference_.get());
  builder.RegisterService(generation_grpc_.get());
  builder.RegisterService(workers_service_.get());
  builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
  // A connection that never completes its handshake (or its HTTP/2 settings), or that makes no
  // call for a while, gives its descriptor back; gRPC clients reconnect when they call again.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             ClampedMillis(options_.connection_handshake_timeout));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                             ClampedMillis(options_.connection_idle_timeout));
  Metrics* metrics = metrics_.get();
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
  if (auth_tokens_ != nullptr) {  // first, so the metrics see the calls it refuses as refused
    creators.push_back(NewBearerAuthInterceptor(
        auth_tokens_.get(), [metrics](std::string_view reason) { metrics->AuthFailed(reason); }));
  }
  creators.push_back(NewGrpcMetricsInterceptor(metrics));
  builder.experimental().SetInterceptorCreators(std::move(creators));
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    return absl::UnavailableError(absl::StrCat("--listen=", options_.listen, ": cannot listen"));
  }
  worker_registry_->SetCoordinatorAddress(LocalAddressFor(options_.listen, port_));
  connection_guard_ = ConnectionGuard::Install(
      port_, {options_.max_connections, options_.reserved_descriptors},
      [metrics](const char* reason) { metrics->ConnectionRefused(reason); });
  return absl::OkStatus();
}

void Daemon::AnnounceServing() {
  {
    std::lock_guard<std::mutex> lock(health_mu_);
    health_ = health_service_.get();
    // Read-only (a full disk) training is NOT_SERVING until the store takes writes again;
    // serving and the server as a whole are unaffected.
    health_->SetServingStatus(kServiceName, store_writable_);
    health_->SetServingStatus(kInferenceServiceName, models_restored_);
    health_->SetServingStatus("", true);
  }
  log_->ServerStarted(WithPort(options_.listen, port_),
                      metrics_port() == 0 ? "" : WithPort(options_.metrics_listen, metrics_port()),
                      options_.device, absl::StrJoin(AvailableDevices(), ","),
                      NoCudaDeviceReason());
  log_->Log(LogLevel::kInfo, "security",
            {{"tls", TlsModeName(TlsModeOf(options_.tls))},
             {"auth", auth_tokens_ == nullptr ? "off" : "bearer"},
             {"tokens", auth_tokens_ == nullptr ? 0 : auth_tokens_->size()}});
}

absl::Status Daemon::StartHttp() {
  if (options_.metrics_listen.empty()) return absl::OkStatus();
  http::HttpServerOptions http;
  http.listen = options_.metrics_listen;
  // The gRPC port's limits: the largest message is the largest body, and the same reserve.
  http.max_body_bytes = static_cast<size_t>(options_.max_message_bytes);
  http.origin.allowed_hosts = options_.http_allowed_hosts;
  http.limits = options_.http_limits;
  http.limits.reserved_descriptors = options_.reserved_descriptors;
  if (tls_ != nullptr) {
    http.tls = [tls = tls_.get()] {
      std::shared_ptr<const TlsPems> pems = tls->Served();
      return http::HttpTlsPems{pems->cert_chain, pems->key, pems->client_ca};
    };
  }
  if (auth_tokens_ != nullptr) {
    http.authorize = [tokens = auth_tokens_.get(),
                      metrics = metrics_.get()](const std::vector<std::string_view>& values) {
      Caller caller;
      const AuthOutcome outcome = CheckAuthorization(values, *tokens, &caller);
      if (outcome == AuthOutcome::kAccepted) return absl::StatusOr<Caller>(std::move(caller));
      metrics->AuthFailed(AuthFailureReason(outcome));
      return absl::StatusOr<Caller>(absl::UnauthenticatedError(outcome == AuthOutcome::kMissing
                                                                   ? kMissingBearerTokenMessage
                                                                   : kInvalidBearerTokenMessage));
    };
  }
  http.on_request = [metrics = metrics_.get()](const std::string& path, int status,
                                               double seconds) {
    metrics->RecordHttp(http::RouteLabel(path), status, seconds);
  };
  auto server = std::make_unique<http::HttpServer>(std::move(http));
  metrics_->AddMetricsRoute(
      server.get(), options_.metrics_require_token ? http::Access::kToken : http::Access::kOpen);
  serving::AddKServeRoutes(inference_.get(), server.get());
  serving::AddGenerationRoutes(generation_.get(), server.get());
  // The web page and its JSON API, behind the same TLS and tokens.
  web::WebApiOptions web_options;
  web_options.max_long_answers = options_.max_web_long_answers;
  web_options.max_stream_duration = options_.web_stream_max_duration;
  auto web_api = std::make_unique<web::WebApi>(access_.get(), broadcaster_.get(), models_.get(),
                                               metrics_.get(), jobs_feed_.get(), web_options);
  web_api->AddRoutes(server.get());
  web::AddWebPageRoutes(server.get());
  absl::StatusOr<int> port = server->Start();
  if (!port.ok()) {
    if (!options_.metrics_optional) return port.status();
    log_->Log(LogLevel::kWarning, "metrics_off",
              {{"reason", std::string(port.status().message())}});
    return absl::OkStatus();
  }
  web_api_ = std::move(web_api);
  http_ = std::move(server);
  return absl::OkStatus();
}

void Daemon::RestoreModels(const std::vector<serving::DeploymentRecord>& records) {
  log_->Log(LogLevel::kInfo, "models_restoring", {{"versions", static_cast<int>(records.size())}});
  const std::vector<std::string> failures = inference_->Restore(records);
  for (const std::string& failure : failures) {
    log_->Log(LogLevel::kError, "model_restore_failed", {{"reason", failure}});
  }
  log_->Log(LogLevel::kInfo, "models_restored",
            {{"loaded", static_cast<int>(records.size() - failures.size())},
             {"failed", static_cast<int>(failures.size())}});
  std::lock_guard<std::mutex> lock(health_mu_);
  models_restored_ = true;
  if (health_ == nullptr) return;  // shutting down: stays NOT_SERVING
  health_->SetServingStatus(kInferenceServiceName, true);
  inference_->SetReady(true);
}

absl::Status Daemon::ReloadAuthTokens() {
  if (auth_tokens_ == nullptr) {
    log_->Log(LogLevel::kWarning, "auth_tokens_reload_skipped",
              {{"reason", "no --auth_tokens_file; auth is off"}});
    return absl::FailedPreconditionError("auth is off (no --auth_tokens_file)");
  }
  absl::StatusOr<int> count = auth_tokens_->Reload();
  if (!count.ok()) {
    // The message names the file and the line, never a token.
    log_->Log(LogLevel::kError, "auth_tokens_reload_failed",
              {{"file", auth_tokens_->path()},
               {"reason", std::string(count.status().message())},
               {"kept_tokens", auth_tokens_->size()}});
    return count.status();
  }
  log_->Log(LogLevel::kInfo, "auth_tokens_reloaded",
            {{"file", auth_tokens_->path()}, {"tokens", *count}});
  LogBareTokens();
  return absl::OkStatus();
}

void Daemon::LogBareTokens() {
  if (const int bare = auth_tokens_->bare_tokens(); bare > 0) {
    log_->Log(LogLevel::kWarning, "auth_tokens_without_identity",
              {{"file", auth_tokens_->path()},
               {"tokens", bare},
               {"meaning",
                "each is an admin named \"admin\" of no team; give it user=, team= and "
                "role= to say who it is"}});
  }
}

absl::StatusOr<bool> Daemon::ReloadTls() {
  if (tls_ == nullptr) return absl::FailedPreconditionError("TLS is off (no --tls_cert)");
  return tls_->Reload();
}

void Daemon::Reload() {
  if (auth_tokens_ == nullptr && tls_ == nullptr) {
    log_->Log(LogLevel::kWarning, "reload_skipped",
              {{"reason", "no --auth_tokens_file and no --tls_cert: nothing to read again"}});
    return;
  }
  if (auth_tokens_ != nullptr) ReloadAuthTokens().IgnoreError();
  if (tls_ != nullptr) ReloadTls().IgnoreError();
}

absl::Status Daemon::Shutdown(absl::Duration deadline) {
  if (shut_down_) return absl::OkStatus();
  shut_down_ = true;
  {
    std::lock_guard<std::mutex> lock(health_mu_);
    health_->SetServingStatus(kServiceName, false);
    health_->SetServingStatus(kInferenceServiceName, false);
    health_->SetServingStatus("", false);
    health_ = nullptr;
  }
  inference_->SetReady(false);
  // Restoring resolves checkpoints through the manager: it ends before the manager stops.
  if (restore_thread_.joinable()) restore_thread_.join();
  follow_observer_->Attach(nullptr);
  follower_->Stop();
  absl::Status jobs = manager_->Shutdown(deadline);
  broadcaster_->CloseAll(absl::UnavailableError("kilnd is shutting down"));
  // In-flight calls get a moment to finish; after it they are cancelled. The HTTP port stops
  // meanwhile (/metrics served until now): its requests being answered finish, and an idle
  // kept-alive connection can hold it for its 5 s keep-alive.
  std::thread http_stop([this] {
    if (web_api_ != nullptr) web_api_->Stop();  // its open event streams end at their next turn
    if (http_ != nullptr) http_->Stop();
  });
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_->Wait();
  http_stop.join();
  return jobs;
}

void Daemon::StoreWritable(bool writable) {
  metrics_->StoreWritable(writable);
  log_->Log(writable ? LogLevel::kInfo : LogLevel::kError, "store_writable",
            {{"writable", writable}});
  std::lock_guard<std::mutex> lock(health_mu_);
  store_writable_ = writable;
  if (health_ != nullptr) health_->SetServingStatus(kServiceName, writable);
}

Daemon::~Daemon() {
  if (server_ != nullptr) Shutdown(absl::InfiniteDuration()).IgnoreError();
  // A Start that failed after the follower existed: jobs the manager recovered may still write
  // checkpoints until the manager goes, after the follower.
  if (follow_observer_ != nullptr) follow_observer_->Attach(nullptr);
  if (metrics_ != nullptr) metrics_->SetInferenceQueueSource(nullptr);
}

}  // namespace kiln::server
