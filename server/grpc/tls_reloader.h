// kilnd's TLS credentials, renewed without a restart.
//
// gRPC's file watcher re-reads its files every second and takes whatever it finds: a key that
// does not fit the certificate, a half-renewed pair (key renewed, certificate not yet) or a
// deleted file, and every new handshake fails until the files are right again. So gRPC watches
// copies in a folder of kilnd's own, and kilnd replaces them only with a set that passed
// ReadTlsFiles: the key and the certificate chain in one file (so one rename swaps both), the
// client CA in another. A bad renewal is logged and the set in force stays.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/grpc/tls_credentials.h"
#include "server/observability/logging.h"
#include "server/observability/metrics.h"

namespace grpc {
class ServerCredentials;
}

namespace kiln::server {

class TlsReloader {
 public:
  // Checks `files` (TLS or mutual TLS; the error names the flag), writes the copies into
  // `served_dir` (made if missing; the folder 0700, the files 0600) and returns credentials that
  // watch them; `metrics` hears of the certificate served and of each reload. With a positive
  // `reload_interval`, Reload runs that often by itself (logging a failure once, not every time).
  static absl::StatusOr<std::unique_ptr<TlsReloader>> Start(const TlsFiles& files,
                                                            const std::string& served_dir,
                                                            absl::Duration reload_interval,
                                                            EventLog* log, Metrics* metrics);
  ~TlsReloader();  // stops the periodic check
  TlsReloader(const TlsReloader&) = delete;
  TlsReloader& operator=(const TlsReloader&) = delete;

  std::shared_ptr<grpc::ServerCredentials> credentials() const { return credentials_; }

  // The set in force (what gRPC's copies hold), for the HTTP listener's handshakes: cheap, and
  // never waits for a reload's file reads.
  std::shared_ptr<const TlsPems> Served() const {
    std::lock_guard<std::mutex> lock(served_mu_);
    return served_snapshot_;
  }

  // Reads the files again (SIGHUP). Changed and sound: the copies are replaced, new connections
  // get the new set within a second, and it returns true (logged tls_reloaded); unchanged: false;
  // otherwise the error (logged tls_reload_failed) and the set in force stays.
  absl::StatusOr<bool> Reload();

 private:
  TlsReloader(TlsFiles files, std::string served_dir, EventLog* log, Metrics* metrics)
      : files_(std::move(files)),
        served_dir_(std::move(served_dir)),
        log_(log),
        metrics_(metrics) {}
  absl::StatusOr<bool> ReloadLocked(bool log_repeated_failure);
  absl::Status Publish(const TlsPems& pems);
  std::string IdentityPath() const;
  std::string ClientCaPath() const;

  const TlsFiles files_;
  const std::string served_dir_;
  EventLog* const log_;
  Metrics* const metrics_;  // kiln_tls_*: the expiry served, reloads by result
  std::shared_ptr<grpc::ServerCredentials> credentials_;

  std::mutex mu_;
  TlsPems served_;  // what the copies hold
  mutable std::mutex served_mu_;
  std::shared_ptr<const TlsPems> served_snapshot_;  // guarded by served_mu_; a copy of served_
  std::string last_failure_;                        // the periodic check logs a failure once
  bool stopping_ = false;
  std::condition_variable stop_;
  std::thread periodic_;
};

}  // namespace kiln::server
