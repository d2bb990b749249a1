// Every Prometheus metric family kilnd exports, declared in one place and updated through the
// small event API below by the code that owns each event (the jobs core through
// JobMetricsObserver, serving, the gRPC edge).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kiln/v1/training.pb.h"
#include "server/http/http_server.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace kiln {
struct EpochEvent;
struct StepEvent;
}  // namespace kiln

namespace kiln::server {

// Memory of one device at scrape time, in bytes.
struct DeviceMemory {
  std::string device;  // "cpu", "cuda:0"
  int64_t used_bytes = 0;
  int64_t total_bytes = 0;
};

// The CPU entry: this process's resident set and the machine's RAM (from /proc).
DeviceMemory CpuMemory();

// The `model` label of a job's series: its preset, or "custom".
std::string ModelLabel(const v1::JobSpec& spec);

// The label that carries the kiln job id on per-job series. Not `job`: Prometheus sets that to
// the scrape job's name and would rename ours to exported_job.
inline constexpr char kJobIdLabel[] = "job_id";

// This process as Prometheus's standard process collector reports it (from /proc/self).
struct ProcessStats {
  double cpu_seconds = 0;         // user + system
  int64_t resident_bytes = 0;     // resident set
  int64_t virtual_bytes = 0;      // address space
  double start_time_seconds = 0;  // Unix time
  int64_t open_fds = 0;           // descriptors open now
  int64_t max_fds = 0;            // the soft RLIMIT_NOFILE
};
// Reads them now; a field /proc does not give stays 0.
ProcessStats ReadProcessStats();

// Requests waiting in one served version's batcher at scrape time.
struct InferenceQueueDepth {
  std::string model, version;
  int64_t requests = 0;
};

// One served model's numbers as the registry holds them (kiln_inference_*), read back for the
// web page's Models view, so that it shows exactly what Prometheus scrapes.
struct InferenceModelStats {
  std::string model;
  double requests = 0;         // kiln_inference_requests_total, every version and code
  double failed_requests = 0;  // of those, the ones whose code is not OK
  // Latency quantiles in seconds, estimated from the histogram's buckets as Prometheus's
  // histogram_quantile estimates them; 0 before the first request.
  double p50_seconds = 0, p90_seconds = 0, p99_seconds = 0;
};

// The q-quantile (0..1) of a histogram given as (upper bound, cumulative count) buckets in
// increasing order, the last one +Inf: linear within the bucket the rank falls in, as
// histogram_quantile; the highest finite bound when it falls in +Inf; 0 when empty.
double BucketQuantile(double q, const std::vector<std::pair<double, uint64_t>>& buckets);

struct MetricsOptions {
  // Job-labelled series are removed this long after their job ends,
  absl::Duration job_retention = absl::Minutes(10);
  // or sooner, the first to end first, when more ended jobs than this still have them: so a
  // stream of short jobs cannot grow kilnd by its rate times job_retention (each job's series
  // take about 20 KB).
  int max_ended_jobs = 500;
  // Queried at every scrape for kiln_device_memory_*; the default reports CpuMemory() only.
  std::function<std::vector<DeviceMemory>()> device_memory;
};

// Thread-safe. Every method is cheap enough to call per training step or per request.
class Metrics {
 public:
  explicit Metrics(MetricsOptions options = {});
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Serves the registry alone as text at http://`listen`/metrics (HOST:PORT, port 0 picks one).
  // Unavailable when the address cannot be bound. Call at most once. kilnd does not use this:
  // its HTTP listener serves /metrics (AddMetricsRoute) beside the KServe v2 REST API.
  absl::Status Serve(const std::string& listen);
  // Adds GET /metrics (the Prometheus text format) to `server`, open or behind its tokens.
  void AddMetricsRoute(http::HttpServer* server, http::Access access);
  // The bound port after Serve, else 0.
  int port() const { return port_; }
  // The text exposition of everything, exactly as a scrape gets it.
  std::string Scrape() const;

  // --- jobs ---------------------------------------------------------------------------------
  void JobSubmitted();
  // A job moved from `from` (UNSPECIFIED for a job just created or loaded) to `to`. Final states
  // count a completion and start the retention clock of the job's series; a new run stops it.
  void JobStateChanged(const std::string& job_id, v1::JobState from, v1::JobState to);
  // Who waits: kiln_queued_jobs{priority, team} as `job` (already in its new state) enters or
  // leaves QUEUED, and on leaving it for RUNNING, how long it waited
  // (kiln_queue_wait_seconds{priority, team}). Teams come from the token file: bounded.
  void JobQueueChanged(const v1::Job& job, v1::JobState from);
  // A higher-priority job asked `job` to stop for its slot: kiln_preemptions_total{priority}.
  void JobPreempted(const v1::Job& job);
  // A call of `team` refused by its `quota` ("storage"): kiln_quota_refusals_total{team, quota}.
  void QuotaRefused(const std::string& team, const std::string& quota);

  // --- training, per job ----------------------------------------------------------------------
  // A run of the job begins: its series (labels job_id, model) exist from now on.
  void TrainingStarted(const std::string& job_id, const std::string& model, int target_epochs);
  // One optimizer step of `samples` samples took `step_seconds`.
  void TrainingStep(const std::string& job_id, const StepEvent& step, int64_t samples,
                    double step_seconds);
  void TrainingEpoch(const std::string& job_id, const EpochEvent& epoch);
  // One rank's step of a job of several workers: kiln_worker_samples_per_second{rank},
  // kiln_allreduce_duration_seconds, kiln_allreduce_bytes_total, kiln_job_workers.
  void WorkerStep(const std::string& job_id, int rank, int world_size, double samples_per_sec,
                  double allreduce_seconds, int64_t allreduce_bytes);
  // kind: CheckpointKindName's "periodic", "best", "on_demand", "shutdown", "final".
  void CheckpointWritten(const std::string& job_id, const std::string& kind, double seconds,
                         int64_t bytes);

  // --- inference (for the serving front end) --------------------------------------------------
  // Queried at every scrape for kiln_inference_queue_depth (one series per entry, so a version
  // no longer listed has none); null: the family is empty. Whatever `source` reads must outlive
  // it: set it back to null before that goes.
  void SetInferenceQueueSource(std::function<std::vector<InferenceQueueDepth>()> source);
  // One ModelInfer request: its outcome, total latency, time spent queued for a batch, and the
  // size of the batch it ran in.
  void RecordInference(const std::string& model, const std::string& version, absl::StatusCode code,
                       double seconds, double queue_seconds, int batch_size);
  // Drops the series of an undeployed model.
  void ForgetInferenceModel(const std::string& model);
  // Every model with inference series, by name, read from the registry's families.
  std::vector<InferenceModelStats> InferenceStats() const;

  // --- gRPC ---------------------------------------------------------------------------------
  // One finished call of `method` ("/pkg.Service/Method"); fed by the edge's interceptor
  // (server/grpc/metrics_interceptor.h).
  void RecordGrpc(const std::string& method, int code, double seconds);

  // --- HTTP (/metrics and KServe v2 REST) ------------------------------------------------------
  // One answered HTTP request: `route` is one of a fixed set of labels (the path with names in
  // braces, "other" for anything else), `status` its HTTP status.
  void RecordHttp(std::string_view route, int status, double seconds);

  // --- auth ---------------------------------------------------------------------------------
  // A call refused for its bearer token; reason: "missing" or "invalid".
  void AuthFailed(std::string_view reason);
  // A connection kilnd closed on accept: "max_connections" or "descriptors".
  void ConnectionRefused(std::string_view reason);

  // --- store ----------------------------------------------------------------------------------
  // The job store took (1) or refused (0, read-only: a full or failing disk) its last write.
  void StoreWritable(bool writable);

  // --- TLS ----------------------------------------------------------------------------------
  // The certificate now served expires at `not_after` (at start and after each renewal).
  void TlsCertificateServed(absl::Time not_after);
  // A reload of the TLS files: "ok" (a renewal now served) or "failed" (the files in force stay).
  void TlsReloaded(std::string_view result);

  // Removes job series whose retention has passed (also done by a background thread).
  void ReapExpiredJobs();

 private:
  struct JobSeries;
  class DeviceCollector;
  class ProcessCollector;

  JobSeries* FindJobLocked(const std::string& job_id);
  void RemoveJobLocked(JobSeries& series);
  void ReaperLoop();

  const MetricsOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<DeviceCollector> devices_;
  std::shared_ptr<ProcessCollector> process_;
  std::unique_ptr<http::HttpServer> http_;
  int port_ = 0;

  // Process-wide families.
  prometheus::Family<prometheus::Gauge>* build_info_;
  prometheus::Family<prometheus::Gauge>* jobs_;
  prometheus::Family<prometheus::Gauge>* queued_jobs_;
  prometheus::Family<prometheus::Histogram>* queue_wait_;
  prometheus::Family<prometheus::Counter>* preemptions_;
  prometheus::Family<prometheus::Counter>* quota_refusals_;
  prometheus::Family<prometheus::Counter>* job_submissions_;
  prometheus::Family<prometheus::Counter>* job_completions_;
  prometheus::Family<prometheus::Counter>* grpc_requests_;
  prometheus::Family<prometheus::Histogram>* grpc_duration_;
  prometheus::Family<prometheus::Counter>* http_requests_;
  prometheus::Family<prometheus::Histogram>* http_duration_;
  prometheus::Family<prometheus::Counter>* auth_failures_;
  prometheus::Family<prometheus::Counter>* connections_refused_;
  prometheus::Family<prometheus::Gauge>* store_writable_;
  prometheus::Family<prometheus::Gauge>* tls_expiry_;
  prometheus::Family<prometheus::Counter>* tls_reloads_;
  // Per job.
  prometheus::Family<prometheus::Gauge>* loss_;
  prometheus::Family<prometheus::Gauge>* test_loss_;
  prometheus::Family<prometheus::Gauge>* test_accuracy_;
  prometheus::Family<prometheus::Gauge>* train_accuracy_;
  prometheus::Family<prometheus::Gauge>* epoch_;
  prometheus::Family<prometheus::Gauge>* target_epochs_;
  prometheus::Family<prometheus::Gauge>* step_;
  prometheus::Family<prometheus::Gauge>* samples_per_second_;
  prometheus::Family<prometheus::Counter>* samples_;
  prometheus::Family<prometheus::Histogram>* step_duration_;
  prometheus::Family<prometheus::Gauge>* learning_rate_;
  prometheus::Family<prometheus::Counter>* checkpoints_;
  prometheus::Family<prometheus::Histogram>* checkpoint_duration_;
  prometheus::Family<prometheus::Gauge>* checkpoint_bytes_;
  prometheus::Family<prometheus::Gauge>* workers_;
  prometheus::Family<prometheus::Gauge>* worker_samples_per_second_;
  prometheus::Family<prometheus::Histogram>* allreduce_duration_;
  prometheus::Family<prometheus::Counter>* allreduce_bytes_;
  // Inference, per model.
  prometheus::Family<prometheus::Counter>* inference_requests_;
  prometheus::Family<prometheus::Histogram>* inference_duration_;
  prometheus::Family<prometheus::Histogram>* inference_queue_;
  prometheus::Family<prometheus::Histogram>* inference_batch_;

  std::map<v1::JobState, prometheus::Gauge*> jobs_by_state_;
  std::map<v1::JobState, prometheus::Counter*> completions_by_state_;

  mutable std::mutex mu_;
  std::condition_variable reaper_cv_;
  bool stopping_ = false;                                          // guarded by mu_
  std::map<std::string, std::unique_ptr<JobSeries>> jobs_series_;  // guarded by mu_
  std::set<std::string> grpc_methods_;                             // guarded by mu_
  std::set<std::string> inference_models_;                         // guarded by mu_
  std::map<std::string, absl::Time> queued_since_;                 // guarded by mu_
  // Apart from mu_, so a scrape reading the queues never holds up the per-request updates.
  mutable std::mutex queue_source_mu_;
  std::function<std::vector<InferenceQueueDepth>()> queue_source_;  // guarded by queue_source_mu_
  std::thread reaper_;
};

}  // namespace kiln::server
