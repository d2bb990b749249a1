// One kilnd instance: the store, job manager, metric fan-out and dataset catalog behind a gRPC
// server with health checking and reflection. main.cc wraps it; tests run it in-process.
#pragma once

#include <grpcpp/server.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/access/audit_log.h"
#include "server/access/auth_tokens.h"
#include "server/access/job_access.h"
#include "server/datasets/dataset_catalog.h"
#include "server/grpc/connection_guard.h"
#include "server/grpc/health_service.h"
#include "server/grpc/tls_credentials.h"
#include "server/grpc/tls_reloader.h"
#include "server/http/http_server.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/job_store.h"
#include "server/jobs/metric_broadcaster.h"
#include "server/jobs/spec_translation.h"
#include "server/jobs/state_dir_lock.h"
#include "server/jobs/worker_attempt.h"
#include "server/observability/job_observers.h"
#include "server/observability/logging.h"
#include "server/observability/metrics.h"
#include "server/serving/generation_grpc_service.h"
#include "server/serving/generation_service.h"
#include "server/serving/inference_service.h"
#include "server/serving/model_follower.h"
#include "server/serving/model_repository.h"
#include "server/web/jobs_feed.h"
#include "server/web/web_api.h"

namespace grpc {
class Server;
}

namespace kiln::server {

class TrainingService;
class WorkersService;

struct DaemonOptions {
  std::string listen = "127.0.0.1:7070";  // HOST:PORT; port 0 picks a free one
  std::string state_dir;                  // the store and the checkpoints
  std::string data_dir;                   // the datasets, one folder each
  std::string device = "auto";            // for jobs that name none
  int max_jobs_per_device = 1;
  int max_crash_resumes = 3;  // see JobManagerOptions
  int max_queued_jobs = 1000;
  TeamQuota team_quota;                // what one team runs at once (0: no limit)
  int64_t team_max_storage_bytes = 0;  // datasets and checkpoints one team keeps (0: no limit)
  int64_t max_upload_bytes = int64_t{512} << 20;
  int max_message_bytes = 16 << 20;
  // Connections (server/grpc/connection_guard.h): at most max_connections open, none taking the
  // last reserved_descriptors below the open-file limit; closed when they have not finished the
  // HTTP/2 (and TLS) handshake within handshake_timeout, or made no call for idle_timeout.
  int max_connections = 1000;
  int reserved_descriptors = 64;
  absl::Duration connection_handshake_timeout = absl::Seconds(10);
  absl::Duration connection_idle_timeout = absl::Minutes(5);
  // The HTTP port's (server/http/http_server.h); its reserved_descriptors is the one above.
  http::HttpLimits http_limits;
  int max_streams = 256;                // WatchJob/ExportCheckpoint/UploadDataset open at once
  int max_health_watches = 256;         // grpc.health.v1 Watch streams open at once (no token)
  int64_t max_inference_batch = 16384;  // samples in one ModelInfer
  int max_deploy_batch_size = 1024;     // the largest max_batch_size a deployment may ask
  // What all deployed versions together may need (ModelRepositoryOptions::max_total_memory_bytes);
  // kilnd's flag defaults to half of the machine's memory.
  int64_t max_serving_memory_bytes = int64_t{8} << 30;
  size_t watch_buffer_events = 1024;
  // Step events kept per job (JobStoreOptions); older steps are thinned past it.
  int64_t max_step_events_per_job = 10'000;
  int64_t max_epoch_events_per_job = 20'000;  // epoch events kept per job; the oldest go
  int watch_replay_page_events = 256;         // see JobManagerOptions; tests make it small
  SpecLimits limits;
  absl::Duration step_delay = absl::ZeroDuration();  // tests only
  // Jobs of several workers: the kiln-worker executable started for local workers (empty: the
  // one beside kilnd), and how long they (and external ones) may take to join.
  std::string worker_binary;
  absl::Duration worker_join_timeout = absl::Seconds(60);
  absl::Duration external_worker_join_timeout = absl::Minutes(10);
  // A worker that joined and is not heard from (a report or a keep-alive) for this long fails
  // its job's attempt.
  absl::Duration worker_heartbeat_timeout = absl::Minutes(1);
  // What a job's workers may hold of kilnd (rendezvous waits), whatever they send.
  WorkerLimits worker_limits;
  // TLS of the workers kilnd starts, when it serves TLS: the CA that signed --tls_cert (and the
  // name to verify, when the certificate does not name the listen address), and with mutual
  // TLS a client certificate and key. Without them such jobs are refused at Submit.
  std::string worker_tls_ca, worker_tls_server_name, worker_tls_cert, worker_tls_key;
  // The HTTP listener on HOST:PORT (port 0 picks one): Prometheus /metrics and the KServe v2
  // REST API under /v2, with the TLS and tokens of the gRPC port; empty: not served.
  std::string metrics_listen;
  // Whether /metrics needs a bearer token too (when tokens are on); Prometheus scrapes
  // usually send none, so it is open by default.
  bool metrics_require_token = false;
  bool metrics_optional = false;  // true: an address that cannot be bound only warns
  // Host names the HTTP port serves besides IP addresses and localhost, when it asks no token
  // (server/http/request_origin.h).
  std::vector<std::string> http_allowed_hosts;
  // The web API's long answers open at once: live event streams (/api/jobs/{id}/events,
  // /api/events) and checkpoint downloads, each holding one of the HTTP listener's 16 threads;
  // more are answered 503.
  int max_web_long_answers = 4;
  // An event stream ends after this with an "end" event (DEADLINE_EXCEEDED) that the page answers
  // by opening it again: a client that never reads cannot keep a place for longer.
  absl::Duration web_stream_max_duration = absl::Minutes(5);
  // Text generations running at once (REST generate, generate_stream, gRPC GenerationService),
  // over all models; more are refused RESOURCE_EXHAUSTED (429). Each also ends after
  // web_stream_max_duration.
  int max_generations = 4;
  absl::Duration metrics_job_retention = absl::Minutes(10);
  int metrics_max_ended_jobs = 500;  // ended jobs whose series are kept at most
  // Security: TLS from these PEM files (none: plaintext); bearer tokens, one per line, required
  // on every call but health when set.
  TlsFiles tls;
  // How often the TLS files are read again (0: only on Reload, i.e. SIGHUP).
  absl::Duration tls_reload_interval = absl::ZeroDuration();
  std::string auth_tokens_file;
  LogFormat log_format = LogFormat::kText;
  std::FILE* log_stream = stderr;  // the event log; null: none
};

class Daemon {
 public:
  // Opens the store, recovers jobs, and starts serving.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonOptions& options);
  ~Daemon();

  // The port actually bound.
  int port() const { return port_; }
  JobManager& manager() { return *manager_; }
  // The metric families (also when not served), for serving and tests to feed and read.
  Metrics& metrics() { return *metrics_; }
  EventLog& event_log() { return *log_; }
  // The HTTP port (/metrics and /v2) actually bound; 0 when not served.
  int metrics_port() const { return http_ == nullptr ? 0 : http_->port(); }
  // The web page's API on that port; null when it is not served.
  const web::WebApi* web_api() const { return web_api_.get(); }

  // Graceful stop: health goes NOT_SERVING, new jobs are refused, running jobs checkpoint and
  // stop (staying RUNNING in the store, to resume on the next start), watchers are told, and
  // the server stops. DeadlineExceeded when jobs did not stop by `deadline`.
  absl::Status Shutdown(absl::Duration deadline);

  // Reads --auth_tokens_file again (SIGHUP). On failure the old tokens stay in force; either way
  // the outcome is logged. FailedPrecondition when auth is off.
  absl::Status ReloadAuthTokens();
  // Reads the TLS files again (SIGHUP, and every tls_reload_interval): a sound renewal is served
  // to new connections, a bad one is logged and the files in force stay. True when they changed;
  // FailedPrecondition when TLS is off.
  absl::StatusOr<bool> ReloadTls();
  // SIGHUP: ReloadAuthTokens and ReloadTls, each where it is on; a warning when neither is.
  void Reload();

 private:
  // A warning naming how many tokens have no identity (each an admin), when some have none.
  void LogBareTokens();
  Daemon() = default;

  DaemonOptions options_;
  // Held from before the store opens until after it closes (declared first: destroyed last).
  std::optional<StateDirLock> state_dir_lock_;
  // First, so they outlive everything that reports to them.
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<EventLog> log_;
  std::unique_ptr<JobMetricsObserver> job_metrics_;
  std::unique_ptr<JobLogObserver> job_log_;
  // Tells follower_ of checkpoints once serving exists; outlives the manager that calls it.
  class CheckpointFollowObserver;
  std::unique_ptr<CheckpointFollowObserver> follow_observer_;
  // Tells the web page's jobs table which jobs changed; outlives the manager that calls it.
  std::unique_ptr<web::JobsFeed> jobs_feed_;
  std::unique_ptr<AuthTokens> auth_tokens_;  // null: auth off; read by the server's interceptor
  std::unique_ptr<TlsReloader> tls_;         // null: plaintext
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<MetricBroadcaster> broadcaster_;
  std::unique_ptr<DatasetCatalog> datasets_;
  // Attempts of jobs of several workers and their tokens; outlives the manager and the service.
  std::unique_ptr<WorkerRegistry> worker_registry_;
  // Declared before the manager, so they outlive its training threads, which answer (and so
  // audit) checkpoint requests until they stop.
  std::unique_ptr<AuditLog> audit_;
  std::unique_ptr<JobAccess> access_;  // the jobs core as each caller sees it
  std::unique_ptr<JobManager> manager_;
  std::unique_ptr<TrainingService> service_;
  std::unique_ptr<WorkersService> workers_service_;
  std::unique_ptr<HealthService> health_service_;  // above server_: outlives its calls
  // Serving: above server_, so in-flight inference calls end before these go.
  std::unique_ptr<serving::ModelRepository> models_;
  std::unique_ptr<serving::InferenceService> inference_;
  std::unique_ptr<serving::GenerationService> generation_;
  std::unique_ptr<serving::GenerationGrpcService> generation_grpc_;
  // Loads new versions of models that follow a job's checkpoints; before models_ goes.
  std::unique_ptr<serving::ModelFollower> follower_;
  // The web page's JSON API on http_ (null when http_ is); above http_, so it outlives its routes.
  std::unique_ptr<web::WebApi> web_api_;
  // /metrics and KServe v2 REST; below inference_ and metrics_, so it stops before they go.
  std::unique_ptr<http::HttpServer> http_;
  // Loads the recorded deployments after the server starts; joined by Shutdown.
  std::thread restore_thread_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<ConnectionGuard> connection_guard_;  // on the server's port
  int port_ = 0;
  bool shut_down_ = false;

  // Start's phases, in its order; each uses the members the ones before it made.
  // Takes the state dir (FailedPrecondition when another kilnd holds it) and removes what an
  // interrupted write left there.
  absl::Status LockStateDir();
  // TLS (tls_) and bearer tokens (auth_tokens_), where the options ask for them.
  absl::Status StartSecurity();
  // The store, with checkpoint files it does not record removed.
  absl::Status OpenStore();
  // The job manager with what it reports to, its recovered jobs, and the gRPC services on it.
  absl::Status StartJobs();
  // The model repository, the inference service and the follower of checkpoints.
  void StartServing();
  serving::InferenceServiceOptions InferenceOptions();
  // The deployments recorded before the last stop that can be read; while there are any,
  // serving is not ready (RestoreModels loads them once the server is up).
  absl::StatusOr<std::vector<serving::DeploymentRecord>> DeploymentsToRestore();
  // Serves /metrics and the KServe v2 REST API on metrics_listen, with the gRPC port's TLS,
  // tokens and message limit. Unavailable when it cannot bind (a warning with metrics_optional).
  absl::Status StartHttp();
  // The gRPC server on options_.listen with its services, interceptors and connection guard.
  // Unavailable when it cannot listen.
  absl::Status StartGrpc();
  // Health goes SERVING (training as the store allows, serving once deployments are restored)
  // and the log says where kilnd listens and with which security.
  void AnnounceServing();

  // The store took (true) or refused (false) its last write: the training service's health
  // follows it. Called by the job manager, from Recover on, also before the server exists.
  void StoreWritable(bool writable);
  // Loads the deployments recorded before the last stop; serving's health and ServerReady stay
  // false until each has loaded or failed (failures are UNAVAILABLE in the index, with reasons).
  void RestoreModels(const std::vector<serving::DeploymentRecord>& records);
  std::mutex health_mu_;
  bool store_writable_ = true;       // guarded by health_mu_
  bool models_restored_ = true;      // guarded by health_mu_
  HealthService* health_ = nullptr;  // guarded; null before start and after stop
};

}  // namespace kiln::server
