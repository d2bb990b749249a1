#include "server/observability/metrics.h"

#include <dirent.h>
#include <httplib.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <fstream>
#include <iterator>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/trainer.h"
#include "server/jobs/job_vocabulary.h"
#include "server/scheduling/queue_order.h"

#ifndef KILN_VERSION
#define KILN_VERSION "unknown"
#endif
#ifndef KILN_CUDA_VERSION
#define KILN_CUDA_VERSION "none"
#endif
#ifndef KILN_CUDNN_VERSION
#define KILN_CUDNN_VERSION "none"
#endif

namespace kiln::server {
namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;
using prometheus::Labels;

// Distinct label values a client can make us create are capped; the rest fold into "other".
constexpr size_t kMaxGrpcMethods = 200;
constexpr size_t kMaxInferenceModels = 100;

// Training steps run from ~100 us (a tiny MLP on CPU) to seconds (a big CNN).
const Histogram::BucketBoundaries& StepBuckets() {
  static const auto* b =
      new Histogram::BucketBoundaries{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                      0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};
  return *b;
}
const Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* b =
      new Histogram::BucketBoundaries{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                      0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};
  return *b;
}
const Histogram::BucketBoundaries& CheckpointBuckets() {
  static const auto* b = new Histogram::BucketBoundaries{
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  return *b;
}
// A job waits from a second (a free slot) to days (a busy GPU node).
const Histogram::BucketBoundaries& QueueWaitBuckets() {
  static const auto* b = new Histogram::BucketBoundaries{
      0.1, 0.5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 24 * 3600};
  return *b;
}

// The labels of a job's place in the queues.
std::map<std::string, std::string> QueueLabels(const v1::Job& job) {
  const std::string& team = job.owner().team();
  return {{"priority", PriorityName(job.spec().priority())},
          {"team", team.empty() ? "none" : team}};
}

const Histogram::BucketBoundaries& BatchBuckets() {
  static const auto* b =
      new Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
  return *b;
}

std::string CodeLabel(absl::StatusCode code) { return absl::StatusCodeToString(code); }

template <typename T>
Family<T>* Declare(prometheus::detail::Builder<T> builder, prometheus::Registry& registry,
                   const char* name, const char* help) {
  return &builder.Name(name).Help(help).Register(registry);
}

}  // namespace

DeviceMemory CpuMemory() {
  DeviceMemory m;
  m.device = "cpu";
  const int64_t page = sysconf(_SC_PAGESIZE);
  m.total_bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * page;
  std::ifstream statm("/proc/self/statm");
  int64_t size_pages = 0, resident_pages = 0;
  if (statm >> size_pages >> resident_pages) m.used_bytes = resident_pages * page;
  return m;
}

std::string ModelLabel(const v1::JobSpec& spec) {
  return spec.preset().empty() ? "custom" : spec.preset();
}

namespace {

std::string ReadWholeFile(const char* path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The boot time (Unix seconds) from /proc/stat's btime line; 0 when absent.
int64_t BootTimeSeconds() {
  for (absl::string_view line : absl::StrSplit(ReadWholeFile("/proc/stat"), '\n')) {
    int64_t btime = 0;
    if (absl::ConsumePrefix(&line, "btime ") && absl::SimpleAtoi(line, &btime)) return btime;
  }
  return 0;
}

// Descriptors in /proc/self/fd, less the one reading it.
int64_t OpenDescriptors() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  const std::string own = std::to_string(dirfd(dir));
  int64_t n = 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.' && own != e->d_name) ++n;
  }
  closedir(dir);
  return n;
}

}  // namespace

ProcessStats ReadProcessStats() {
  ProcessStats p;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const std::string stat = ReadWholeFile("/proc/self/stat");
  // Field 2, the command, is in parentheses and may hold spaces and parentheses itself: the
  // fields after the last ')' start at field 3.
  if (const size_t close = stat.rfind(')'); close != std::string::npos && ticks > 0) {
    const std::vector<std::string> fields =
        absl::StrSplit(absl::string_view(stat).substr(close + 1), ' ', absl::SkipEmpty());
    auto field = [&](size_t n) {  // proc(5)'s 1-based field number
      int64_t v = 0;
      return n - 3 < fields.size() && absl::SimpleAtoi(fields[n - 3], &v) ? v : 0;
    };
    p.cpu_seconds = static_cast<double>(field(14) + field(15)) / ticks;  // utime + stime
    if (const int64_t boot = BootTimeSeconds(); boot > 0) {
      p.start_time_seconds = static_cast<double>(boot) + static_cast<double>(field(22)) / ticks;
    }
    p.virtual_bytes = field(23);
    p.resident_bytes = field(24) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  }
  p.open_fds = OpenDescriptors();
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    p.max_fds = static_cast<int64_t>(std::min<rlim_t>(limit.rlim_cur, INT64_MAX));  // unlimited
  }
  return p;
}

// Device memory is read at scrape time rather than polled.
class Metrics::DeviceCollector : public prometheus::Collectable {
 public:
  explicit DeviceCollector(std::function<std::vector<DeviceMemory>()> source)
      : source_(std::move(source)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    prometheus::MetricFamily used{"kiln_device_memory_used_bytes",
                                  "Memory in use per device (cpu: this process's resident set).",
                                  prometheus::MetricType::Gauge,
                                  {}};
    prometheus::MetricFamily total{"kiln_device_memory_total_bytes",
                                   "Memory per device (cpu: the machine's RAM).",
                                   prometheus::MetricType::Gauge,
                                   {}};
    for (const DeviceMemory& d : source_()) {
      prometheus::ClientMetric m;
      m.label.push_back({"device", d.device});
      m.gauge.value = static_cast<double>(d.used_bytes);
      used.metric.push_back(m);
      m.gauge.value = static_cast<double>(d.total_bytes);
      total.metric.push_back(m);
    }
    return {used, total};
  }

 private:
  std::function<std::vector<DeviceMemory>()> source_;
};

// The process_* families of Prometheus's client libraries, same names, types and units, so
// dashboards made for any exporter work; read from /proc at scrape time.
class Metrics::ProcessCollector : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    const ProcessStats p = ReadProcessStats();
    auto family = [](const char* name, const char* help, prometheus::MetricType type,
                     double value) {
      prometheus::ClientMetric m;
      if (type == prometheus::MetricType::Counter) {
        m.counter.value = value;
      } else {
        m.gauge.value = value;
      }
      return prometheus::MetricFamily{name, help, type, {m}};
    };
    using prometheus::MetricType;
    return {
        family("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
               MetricType::Counter, p.cpu_seconds),
        family("process_resident_memory_bytes", "Resident memory size in bytes.", MetricType::Gauge,
               static_cast<double>(p.resident_bytes)),
        family("process_virtual_memory_bytes", "Virtual memory size in bytes.", MetricType::Gauge,
               static_cast<double>(p.virtual_bytes)),
        family("process_start_time_seconds",
               "Start time of the process since unix epoch in seconds.", MetricType::Gauge,
               p.start_time_seconds),
        family("process_open_fds", "Number of open file descriptors.", MetricType::Gauge,
               static_cast<double>(p.open_fds)),
        family("process_max_fds", "Maximum number of open file descriptors.", MetricType::Gauge,
               static_cast<double>(p.max_fds)),
    };
  }
};

// The series of one job. Pointers are owned by their families; `removers` takes them out.
struct Metrics::JobSeries {
  Labels labels;  // job_id, model
  std::vector<std::function<void()>> removers;
  std::optional<absl::Time> expires;  // set once the job ended

  Gauge* loss = nullptr;
  Gauge* test_loss = nullptr;
  Gauge* test_accuracy = nullptr;
  Gauge* train_accuracy = nullptr;
  Gauge* epoch = nullptr;
  Gauge* target_epochs = nullptr;
  Gauge* step = nullptr;
  Gauge* samples_per_second = nullptr;
  Gauge* learning_rate = nullptr;
  Counter* samples = nullptr;
  Histogram* step_duration = nullptr;
  std::map<std::string, Counter*> checkpoints;  // by kind
  Histogram* checkpoint_duration = nullptr;
  Gauge* checkpoint_bytes = nullptr;
  Gauge* workers = nullptr;
  std::map<int, Gauge*> worker_samples_per_second;  // by rank
  Histogram* allreduce_duration = nullptr;
  Counter* allreduce_bytes = nullptr;

  template <typename T, typename... Args>
  T* Add(Family<T>* family, const Labels& labels_, Args&&... args) {
    T* metric = &family->Add(labels_, std::forward<Args>(args)...);
    removers.push_back([family, metric] { family->Remove(metric); });
    return metric;
  }
  template <typename T, typename... Args>
  T* Get(T*& slot, Family<T>* family, Args&&... args) {
    if (slot == nullptr) slot = Add(family, labels, std::forward<Args>(args)...);
    return slot;
  }
};

Metrics::Metrics(MetricsOptions options)
    : options_(std::move(options)), registry_(std::make_shared<prometheus::Registry>()) {
  auto source = options_.device_memory;
  if (!source) source = [] { return std::vector<DeviceMemory>{CpuMemory()}; };
  devices_ = std::make_shared<DeviceCollector>(std::move(source));
  process_ = std::make_shared<ProcessCollector>();
  prometheus::Registry& r = *registry_;
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;

  build_info_ =
      Declare(BuildGauge(), r, "kiln_build_info", "Always 1; the labels say which kilnd this is.");
  jobs_ = Declare(BuildGauge(), r, "kiln_jobs", "Jobs known to kilnd, by state.");
  job_submissions_ =
      Declare(BuildCounter(), r, "kiln_job_submissions_total", "Jobs accepted by SubmitJob.");
  job_completions_ = Declare(BuildCounter(), r, "kiln_job_completions_total",
                             "Jobs that reached a final state, by that state.");
  grpc_requests_ = Declare(BuildCounter(), r, "kiln_grpc_requests_total",
                           "Finished gRPC calls, by method and status code.");
  grpc_duration_ = Declare(BuildHistogram(), r, "kiln_grpc_request_duration_seconds",
                           "Duration of gRPC calls (streams: until the status), by method.");
  http_requests_ = Declare(BuildCounter(), r, "kiln_http_requests_total",
                           "Answered HTTP requests (/metrics, KServe v2 REST), by route and "
                           "status.");
  http_duration_ = Declare(BuildHistogram(), r, "kiln_http_request_duration_seconds",
                           "Duration of HTTP requests from their head to the answer, by route.");
  auth_failures_ = Declare(BuildCounter(), r, "kiln_auth_failures_total",
                           "gRPC calls and HTTP requests refused for their bearer token, by "
                           "reason (missing, invalid).");
  connections_refused_ =
      Declare(BuildCounter(), r, "kiln_grpc_connections_refused_total",
              "gRPC connections closed on accept, by reason (max_connections: --max_connections "
              "are open; descriptors: only --reserved_descriptors are left).");
  store_writable_ = Declare(BuildGauge(), r, "kiln_store_writable",
                            "1 while the job store takes writes; 0 while it refuses them (a full "
                            "or failing disk under --state_dir): kilnd is read-only, training "
                            "health NOT_SERVING, until a retried write succeeds.");
  tls_expiry_ = Declare(BuildGauge(), r, "kiln_tls_certificate_expiry_timestamp_seconds",
                        "When the TLS certificate kilnd serves expires (Unix time); absent "
                        "without TLS.");
  tls_reloads_ = Declare(BuildCounter(), r, "kiln_tls_reloads_total",
                         "Reloads of the TLS files, by result (ok: a renewal now served; failed: "
                         "files that do not check out, those in force stay); a check that finds "
                         "nothing new counts nothing.");

  loss_ = Declare(BuildGauge(), r, "kiln_training_loss", "Mean loss of the job's latest batch.");
  test_loss_ = Declare(BuildGauge(), r, "kiln_training_test_loss",
                       "Mean test-set loss after the job's latest epoch.");
  test_accuracy_ = Declare(BuildGauge(), r, "kiln_training_test_accuracy",
                           "Test-set accuracy (fraction 0..1) after the job's latest epoch.");
  train_accuracy_ = Declare(BuildGauge(), r, "kiln_training_train_accuracy",
                            "Training accuracy (fraction 0..1) over the job's latest epoch.");
  epoch_ = Declare(BuildGauge(), r, "kiln_training_epoch",
                   "Epochs trained, fractional within the current epoch.");
  target_epochs_ = Declare(BuildGauge(), r, "kiln_training_target_epochs",
                           "Epochs the job is asked to train in all.");
  step_ = Declare(BuildGauge(), r, "kiln_training_step", "Optimizer steps done, across epochs.");
  samples_per_second_ = Declare(BuildGauge(), r, "kiln_training_samples_per_second",
                                "Training throughput over the current epoch so far.");
  samples_ = Declare(BuildCounter(), r, "kiln_training_samples_total",
                     "Training samples processed by this run of the job.");
  step_duration_ = Declare(BuildHistogram(), r, "kiln_training_step_duration_seconds",
                           "Wall time of one optimizer step (forward, backward, update).");
  learning_rate_ =
      Declare(BuildGauge(), r, "kiln_training_learning_rate", "Current learning rate.");
  workers_ = Declare(BuildGauge(), r, "kiln_job_workers",
                     "Data-parallel ranks (worker processes) of a job of several workers.");
  worker_samples_per_second_ =
      Declare(BuildGauge(), r, "kiln_worker_samples_per_second",
              "One rank's training throughput over its latest step (its slice of the batch).");
  allreduce_duration_ =
      Declare(BuildHistogram(), r, "kiln_allreduce_duration_seconds",
              "Wall time of one step's gradient allreduce, per rank of a job of several workers.");
  allreduce_bytes_ = Declare(BuildCounter(), r, "kiln_allreduce_bytes_total",
                             "Bytes of gradients allreduced, summed over the job's ranks.");
  checkpoints_ = Declare(BuildCounter(), r, "kiln_checkpoints_total",
                         "Checkpoints written by this run of the job, by kind.");
  checkpoint_duration_ = Declare(BuildHistogram(), r, "kiln_checkpoint_write_duration_seconds",
                                 "Time to write one checkpoint file, fsync and rename included.");
  checkpoint_bytes_ =
      Declare(BuildGauge(), r, "kiln_checkpoint_bytes", "Size of the job's latest checkpoint.");

  queued_jobs_ = Declare(BuildGauge(), r, "kiln_queued_jobs",
                         "Jobs waiting in a device's queue, by priority and team.");
  queue_wait_ = Declare(BuildHistogram(), r, "kiln_queue_wait_seconds",
                        "Time from a job's (re)queueing to its start, by priority and team.");
  preemptions_ =
      Declare(BuildCounter(), r, "kiln_preemptions_total",
              "Running jobs asked to stop for a higher-priority one, by their priority.");
  quota_refusals_ = Declare(BuildCounter(), r, "kiln_quota_refusals_total",
                            "Calls a team quota refused (uploads, submissions, resumes), by team "
                            "and quota.");

  inference_requests_ = Declare(BuildCounter(), r, "kiln_inference_requests_total",
                                "Inference requests, by model, version and status code.");
  inference_duration_ = Declare(BuildHistogram(), r, "kiln_inference_request_duration_seconds",
                                "End-to-end latency of inference requests, by model.");
  inference_queue_ = Declare(BuildHistogram(), r, "kiln_inference_queue_duration_seconds",
                             "Time inference requests waited for a batch, by model.");
  inference_batch_ = Declare(BuildHistogram(), r, "kiln_inference_batch_size",
                             "Requests per executed inference batch, by model.");

  build_info_
      ->Add({{"version", KILN_VERSION}, {"cuda", KILN_CUDA_VERSION}, {"cudnn", KILN_CUDNN_VERSION}})
      .Set(1);
  // Zero from the start, so a dashboard shows "no preemptions" rather than no data.
  for (v1::Priority p : {v1::PRIORITY_LOW, v1::PRIORITY_NORMAL, v1::PRIORITY_HIGH}) {
    preemptions_->Add({{"priority", PriorityName(p)}});
  }
  for (v1::JobState s : {v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED,
                         v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED}) {
    jobs_by_state_[s] = &jobs_->Add({{"state", JobStateLabel(s)}});
    if (IsFinal(s))
      completions_by_state_[s] = &job_completions_->Add({{"state", JobStateLabel(s)}});
  }
  job_submissions_->Add({});
  // Both reasons exist from the start, so rate() sees the first failure.
  for (const char* reason : {"missing", "invalid"}) auth_failures_->Add({{"reason", reason}});
  for (const char* reason : {"max_connections", "descriptors"}) {
    connections_refused_->Add({{"reason", reason}});
  }
  store_writable_->Add({}).Set(1);
  reaper_ = std::thread(&Metrics::ReaperLoop, this);
  pthread_setname_np(reaper_.native_handle(), "kiln-reaper");
}

Metrics::~Metrics() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  reaper_cv_.notify_all();
  reaper_.join();
  http_.reset();  // stop serving before the families go
}

absl::Status Metrics::Serve(const std::string& listen) {
  if (listen.empty()) return absl::OkStatus();
  http::HttpServerOptions options;
  options.listen = listen;
  auto server = std::make_unique<http::HttpServer>(std::move(options));
  AddMetricsRoute(server.get(), http::Access::kOpen);
  absl::StatusOr<int> port = server->Start();
  if (!port.ok()) return port.status();
  port_ = *port;
  http_ = std::move(server);
  return absl::OkStatus();
}

void Metrics::AddMetricsRoute(http::HttpServer* server, http::Access access) {
  server->Get("/metrics", access,
              [this](const httplib::Request&, httplib::Response& res, const server::Caller&) {
                res.set_content(Scrape(), "text/plain; version=0.0.4; charset=utf-8");
              });
}

std::string Metrics::Scrape() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (prometheus::MetricFamily& f : devices_->Collect()) families.push_back(std::move(f));
  for (prometheus::MetricFamily& f : process_->Collect()) families.push_back(std::move(f));
  // Read, not kept: a version's series goes with it, and requests pay nothing for the gauge.
  prometheus::MetricFamily queue{"kiln_inference_queue_depth",
                                 "Inference requests waiting for a batch now, by model and "
                                 "version.",
                                 prometheus::MetricType::Gauge,
                                 {}};
  {
    std::lock_guard<std::mutex> lock(queue_source_mu_);
    if (queue_source_) {
      for (const InferenceQueueDepth& q : queue_source_()) {
        prometheus::ClientMetric m;
        m.label = {{"model", q.model}, {"version", q.version}};
        m.gauge.value = static_cast<double>(q.requests);
        queue.metric.push_back(std::move(m));
      }
    }
  }
  families.push_back(std::move(queue));
  return prometheus::TextSerializer().Serialize(families);
}

void Metrics::SetInferenceQueueSource(std::function<std::vector<InferenceQueueDepth>()> source) {
  std::lock_guard<std::mutex> lock(queue_source_mu_);
  queue_source_ = std::move(source);
}

void Metrics::JobSubmitted() { job_submissions_->Add({}).Increment(); }

void Metrics::JobStateChanged(const std::string& job_id, v1::JobState from, v1::JobState to) {
  if (from == to) return;
  if (auto it = jobs_by_state_.find(from); it != jobs_by_state_.end()) it->second->Decrement();
  if (auto it = jobs_by_state_.find(to); it != jobs_by_state_.end()) it->second->Increment();
  if (!IsFinal(to)) return;
  // A job loaded already finished was counted when it finished, before the restart.
  if (from != v1::JOB_STATE_UNSPECIFIED) completions_by_state_[to]->Increment();
  std::lock_guard<std::mutex> lock(mu_);
  if (JobSeries* s = FindJobLocked(job_id)) {
    s->expires = absl::Now() + options_.job_retention;
    reaper_cv_.notify_all();
  }
}

void Metrics::JobQueueChanged(const v1::Job& job, v1::JobState from) {
  const bool was = from == v1::JOB_STATE_QUEUED;
  const bool is = job.state() == v1::JOB_STATE_QUEUED;
  if (was == is) return;
  const std::map<std::string, std::string> labels = QueueLabels(job);
  std::lock_guard<std::mutex> lock(mu_);
  if (is) {
    queued_jobs_->Add(labels).Increment();
    queued_since_[job.id()] = absl::Now();
    return;
  }
  queued_jobs_->Add(labels).Decrement();
  auto since = queued_since_.find(job.id());
  if (since == queued_since_.end()) return;
  if (job.state() == v1::JOB_STATE_RUNNING) {
    queue_wait_->Add(labels, QueueWaitBuckets())
        .Observe(absl::ToDoubleSeconds(absl::Now() - since->second));
  }
  queued_since_.erase(since);
}

void Metrics::JobPreempted(const v1::Job& job) {
  preemptions_->Add({{"priority", PriorityName(job.spec().priority())}}).Increment();
}

void Metrics::QuotaRefused(const std::string& team, const std::string& quota) {
  quota_refusals_->Add({{"team", team}, {"quota", quota}}).Increment();
}

Metrics::JobSeries* Metrics::FindJobLocked(const std::string& job_id) {
  auto it = jobs_series_.find(job_id);
  return it == jobs_series_.end() ? nullptr : it->second.get();
}

void Metrics::TrainingStarted(const std::string& job_id, const std::string& model,
                              int target_epochs) {
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<JobSeries>& s = jobs_series_[job_id];
  if (s == nullptr) {
    s = std::make_unique<JobSeries>();
    s->labels = {{kJobIdLabel, job_id}, {"model", model}};
  }
  s->expires.reset();
  s->Get(s->target_epochs, target_epochs_)->Set(target_epochs);
  s->Get(s->samples, samples_);
  s->Get(s->step_duration, step_duration_, StepBuckets());
}

void Metrics::TrainingStep(const std::string& job_id, const StepEvent& e, int64_t samples,
                           double step_seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  JobSeries* s = FindJobLocked(job_id);
  if (s == nullptr) return;
  s->Get(s->loss, loss_)->Set(e.loss);
  s->Get(s->learning_rate, learning_rate_)->Set(e.lr);
  s->Get(s->samples_per_second, samples_per_second_)->Set(e.samples_per_sec);
  s->Get(s->step, step_)->Set(static_cast<double>(e.global_step));
  const double within =
      e.steps_per_epoch > 0 ? static_cast<double>(e.step_in_epoch) / e.steps_per_epoch : 0;
  s->Get(s->epoch, epoch_)->Set(e.epoch - 1 + within);
  s->Get(s->samples, samples_)->Increment(static_cast<double>(samples));
  s->Get(s->step_duration, step_duration_, StepBuckets())->Observe(step_seconds);
}

void Metrics::WorkerStep(const std::string& job_id, int rank, int world_size,
                         double samples_per_sec, double allreduce_seconds,
                         int64_t allreduce_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  JobSeries* s = FindJobLocked(job_id);
  if (s == nullptr) return;
  s->Get(s->workers, workers_)->Set(world_size);
  Gauge*& rate = s->worker_samples_per_second[rank];
  if (rate == nullptr) {
    Labels labels = s->labels;
    labels["rank"] = absl::StrCat(rank);
    rate = s->Add(worker_samples_per_second_, labels);
  }
  rate->Set(samples_per_sec);
  s->Get(s->allreduce_duration, allreduce_duration_, StepBuckets())->Observe(allreduce_seconds);
  s->Get(s->allreduce_bytes, allreduce_bytes_)->Increment(static_cast<double>(allreduce_bytes));
}

void Metrics::TrainingEpoch(const std::string& job_id, const EpochEvent& e) {
  std::lock_guard<std::mutex> lock(mu_);
  JobSeries* s = FindJobLocked(job_id);
  if (s == nullptr) return;
  s->Get(s->epoch, epoch_)->Set(e.epoch);
  s->Get(s->train_accuracy, train_accuracy_)->Set(e.train_accuracy);
  if (e.test.samples > 0) {
    s->Get(s->test_accuracy, test_accuracy_)->Set(e.test.accuracy);
    s->Get(s->test_loss, test_loss_)->Set(e.test.loss);
  }
}

void Metrics::CheckpointWritten(const std::string& job_id, const std::string& kind, double seconds,
                                int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  JobSeries* s = FindJobLocked(job_id);
  if (s == nullptr) return;
  Counter*& by_kind = s->checkpoints[kind];
  if (by_kind == nullptr) {
    Labels labels = s->labels;
    labels["kind"] = kind;
    by_kind = s->Add(checkpoints_, labels);
  }
  by_kind->Increment();
  s->Get(s->checkpoint_duration, checkpoint_duration_, CheckpointBuckets())->Observe(seconds);
  s->Get(s->checkpoint_bytes, checkpoint_bytes_)->Set(static_cast<double>(bytes));
}

void Metrics::RecordInference(const std::string& model, const std::string& version,
                              absl::StatusCode code, double seconds, double queue_seconds,
                              int batch_size) {
  std::string name = model;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (inference_models_.count(name) == 0) {
      if (inference_models_.size() >= kMaxInferenceModels) {
        name = "other";
      } else {
        inference_models_.insert(name);
      }
    }
  }
  inference_requests_->Add({{"model", name}, {"version", version}, {"code", CodeLabel(code)}})
      .Increment();
  inference_duration_->Add({{"model", name}}, LatencyBuckets()).Observe(seconds);
  if (batch_size > 0) {
    inference_queue_->Add({{"model", name}}, LatencyBuckets()).Observe(queue_seconds);
    inference_batch_->Add({{"model", name}}, BatchBuckets()).Observe(batch_size);
  }
}

void Metrics::ForgetInferenceModel(const std::string& model) {
  std::lock_guard<std::mutex> lock(mu_);
  if (inference_models_.erase(model) == 0) return;
  // Families cannot be listed by label, so probe the label sets this model can have.
  const Labels by_model = {{"model", model}};
  if (inference_duration_->Has(by_model)) {
    inference_duration_->Remove(&inference_duration_->Add(by_model, LatencyBuckets()));
  }
  if (inference_queue_->Has(by_model)) {
    inference_queue_->Remove(&inference_queue_->Add(by_model, LatencyBuckets()));
  }
  if (inference_batch_->Has(by_model)) {
    inference_batch_->Remove(&inference_batch_->Add(by_model, BatchBuckets()));
  }
  for (const prometheus::MetricFamily& f : inference_requests_->Collect()) {
    for (const prometheus::ClientMetric& m : f.metric) {
      Labels labels;
      for (const auto& l : m.label) labels[l.name] = l.value;
      if (labels["model"] == model) inference_requests_->Remove(&inference_requests_->Add(labels));
    }
  }
}

std::vector<InferenceModelStats> Metrics::InferenceStats() const {
  std::map<std::string, InferenceModelStats> by_model;
  auto label = [](const prometheus::ClientMetric& m, const std::string& name) {
    for (const prometheus::ClientMetric::Label& l : m.label) {
      if (l.name == name) return l.value;
    }
    return std::string();
  };
  for (const prometheus::MetricFamily& f : inference_requests_->Collect()) {
    for (const prometheus::ClientMetric& m : f.metric) {
      InferenceModelStats& s = by_model[label(m, "model")];
      s.requests += m.counter.value;
      if (label(m, "code") != CodeLabel(absl::StatusCode::kOk))
        s.failed_requests += m.counter.value;
    }
  }
  for (const prometheus::MetricFamily& f : inference_duration_->Collect()) {
    for (const prometheus::ClientMetric& m : f.metric) {
      std::vector<std::pair<double, uint64_t>> buckets;
      for (const prometheus::ClientMetric::Bucket& b : m.histogram.bucket) {
        buckets.emplace_back(b.upper_bound, b.cumulative_count);
      }
      InferenceModelStats& s = by_model[label(m, "model")];
      s.p50_seconds = BucketQuantile(0.5, buckets);
      s.p90_seconds = BucketQuantile(0.9, buckets);
      s.p99_seconds = BucketQuantile(0.99, buckets);
    }
  }
  std::vector<InferenceModelStats> out;
  for (auto& [model, stats] : by_model) {
    stats.model = model;
    out.push_back(std::move(stats));
  }
  return out;
}

double BucketQuantile(double q, const std::vector<std::pair<double, uint64_t>>& buckets) {
  if (buckets.empty() || buckets.back().second == 0) return 0;
  const double rank = q * static_cast<double>(buckets.back().second);
  double lower = 0;
  uint64_t below = 0;
  for (const auto& [upper, count] : buckets) {
    if (static_cast<double>(count) >= rank && count > below) {
      if (std::isinf(upper)) return lower;  // past the last finite bound: the bound is all we know
      return lower + (upper - lower) * (rank - static_cast<double>(below)) /
                         static_cast<double>(count - below);
    }
    lower = upper;
    below = count;
  }
  return lower;
}

void Metrics::RecordGrpc(const std::string& method, int code, double seconds) {
  std::string name = method;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (grpc_methods_.count(name) == 0) {
      if (grpc_methods_.size() >= kMaxGrpcMethods) {
        name = "other";
      } else {
        grpc_methods_.insert(name);
      }
    }
  }
  grpc_requests_->Add({{"method", name}, {"code", CodeLabel(static_cast<absl::StatusCode>(code))}})
      .Increment();
  grpc_duration_->Add({{"method", name}}, LatencyBuckets()).Observe(seconds);
}

void Metrics::RecordHttp(std::string_view route, int status, double seconds) {
  const std::string label(route);
  http_requests_->Add({{"route", label}, {"code", std::to_string(status)}}).Increment();
  http_duration_->Add({{"route", label}}, LatencyBuckets()).Observe(seconds);
}

void Metrics::AuthFailed(std::string_view reason) {
  auth_failures_->Add({{"reason", std::string(reason)}}).Increment();
}

void Metrics::ConnectionRefused(std::string_view reason) {
  connections_refused_->Add({{"reason", std::string(reason)}}).Increment();
}

void Metrics::StoreWritable(bool writable) { store_writable_->Add({}).Set(writable ? 1 : 0); }

void Metrics::TlsCertificateServed(absl::Time not_after) {
  tls_expiry_->Add({}).Set(static_cast<double>(absl::ToUnixSeconds(not_after)));
  // Both results exist once TLS is on, so rate() sees the first failure.
  for (const char* result : {"ok", "failed"}) tls_reloads_->Add({{"result", result}});
}

void Metrics::TlsReloaded(std::string_view result) {
  tls_reloads_->Add({{"result", std::string(result)}}).Increment();
}

void Metrics::RemoveJobLocked(JobSeries& series) {
  for (const auto& remove : series.removers) remove();
  series.removers.clear();
}

void Metrics::ReapExpiredJobs() {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = absl::Now();
  std::vector<std::pair<absl::Time, std::string>> ended;  // (expiry, job) of those kept
  for (auto it = jobs_series_.begin(); it != jobs_series_.end();) {
    if (it->second->expires.has_value() && *it->second->expires <= now) {
      RemoveJobLocked(*it->second);
      it = jobs_series_.erase(it);
    } else {
      if (it->second->expires.has_value()) ended.emplace_back(*it->second->expires, it->first);
      ++it;
    }
  }
  if (static_cast<int>(ended.size()) <= options_.max_ended_jobs) return;
  std::sort(ended.begin(), ended.end());
  for (size_t i = 0; i < ended.size() - options_.max_ended_jobs; ++i) {
    auto it = jobs_series_.find(ended[i].second);
    RemoveJobLocked(*it->second);
    jobs_series_.erase(it);
  }
}

void Metrics::ReaperLoop() {
  // Wakes often enough that a series outlives its retention by at most a second.
  const absl::Duration tick =
      std::clamp(options_.job_retention / 4, absl::Milliseconds(10), absl::Seconds(1));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    reaper_cv_.wait_for(lock, absl::ToChronoNanoseconds(tick));
    if (stopping_) break;
    lock.unlock();
    ReapExpiredJobs();
    lock.lock();
  }
}

}  // namespace kiln::server
