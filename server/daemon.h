// One kilnd instance: the store, job manager, metric fan-out and dataset catalog behind a gRPC
// server with health checking and reflection. main.cc wraps it; tests run it in-process.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/dataset_catalog.h"
#include "server/job_manager.h"
#include "server/job_store.h"
#include "server/metric_broadcaster.h"
#include "server/spec_translation.h"

namespace grpc {
class Server;
}

namespace kiln::server {

class TrainingService;

struct DaemonOptions {
  std::string listen = "127.0.0.1:7070";  // HOST:PORT; port 0 picks a free one
  std::string state_dir;                  // the store and the checkpoints
  std::string data_dir;                   // the datasets, one folder each
  std::string device = "auto";            // for jobs that name none
  int max_jobs_per_device = 1;
  int max_queued_jobs = 1000;
  int64_t max_upload_bytes = int64_t{512} << 20;
  int max_message_bytes = 16 << 20;
  size_t watch_buffer_events = 1024;
  SpecLimits limits;
  absl::Duration step_delay = absl::ZeroDuration();  // tests only
};

class Daemon {
 public:
  // Opens the store, recovers jobs, and starts serving.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonOptions& options);
  ~Daemon();

  // The port actually bound.
  int port() const { return port_; }
  JobManager& manager() { return *manager_; }

  // Graceful stop: health goes NOT_SERVING, new jobs are refused, running jobs checkpoint and
  // stop (staying RUNNING in the store, to resume on the next start), watchers are told, and
  // the server stops. DeadlineExceeded when jobs did not stop by `deadline`.
  absl::Status Shutdown(absl::Duration deadline);

 private:
  Daemon() = default;

  DaemonOptions options_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<MetricBroadcaster> broadcaster_;
  std::unique_ptr<DatasetCatalog> datasets_;
  std::unique_ptr<JobManager> manager_;
  std::unique_ptr<TrainingService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;
};

}  // namespace kiln::server
