#include "server/grpc/tls_reloader.h"

#include <fcntl.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"

namespace kiln::server {
namespace {

// How often gRPC looks at the copies; reading two small files a second costs nothing.
constexpr unsigned int kWatchSeconds = 1;

// Replaces `path` with `content` (mode 0600) so that gRPC's reader sees the old copy or the new,
// never a part.
absl::Status WriteAtomically(const std::string& path, const std::string& content) {
  absl::Status status = WriteFileAtomically(path, content, 0600);
  if (status.ok()) return status;
  return absl::InternalError(
      absl::StrCat("cannot write the served TLS copy ", path, ": ", status.message()));
}

bool SamePems(const TlsPems& a, const TlsPems& b) {  // not_after follows from cert_chain
  return a.cert_chain == b.cert_chain && a.key == b.key && a.client_ca == b.client_ca;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TlsReloader>> TlsReloader::Start(const TlsFiles& files,
                                                                const std::string& served_dir,
                                                                absl::Duration reload_interval,
                                                                EventLog* log, Metrics* metrics) {
  KILN_ASSIGN_OR_RETURN(TlsPems pems, ReadTlsFiles(files));
  std::error_code ec;
  std::filesystem::create_directories(served_dir, ec);
  if (ec || ::chmod(served_dir.c_str(), 0700) != 0) {
    return absl::InternalError(absl::StrCat("cannot make the folder for the served TLS copies ",
                                            served_dir, ": ",
                                            ec ? ec.message() : std::strerror(errno)));
  }
  std::unique_ptr<TlsReloader> reloader(new TlsReloader(files, served_dir, log, metrics));
  KILN_RETURN_IF_ERROR(reloader->Publish(pems));
  metrics->TlsCertificateServed(pems.not_after);
  reloader->served_ = std::move(pems);
  reloader->served_snapshot_ = std::make_shared<const TlsPems>(reloader->served_);

  const bool mutual = !files.client_ca.empty();
  // The identity file holds the key and the chain: OpenSSL's PEM readers skip blocks of the
  // other kind, so it serves as both the key file and the certificate file.
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      reloader->IdentityPath(), reloader->IdentityPath(),
      mutual ? reloader->ClientCaPath() : std::string(), kWatchSeconds);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (mutual) options.watch_root_certs();
  options.set_cert_request_type(mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                       : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  reloader->credentials_ = grpc::experimental::TlsServerCredentials(options);

  if (reload_interval > absl::ZeroDuration()) {
    TlsReloader* self = reloader.get();
    reloader->periodic_ = std::thread([self, reload_interval] {
      std::unique_lock<std::mutex> lock(self->mu_);
      const auto every = std::chrono::milliseconds(absl::ToInt64Milliseconds(reload_interval));
      while (!self->stop_.wait_for(lock, every, [self] { return self->stopping_; })) {
        self->ReloadLocked(/*log_repeated_failure=*/false).IgnoreError();
      }
    });
    pthread_setname_np(reloader->periodic_.native_handle(), "kiln-tls");
  }
  return reloader;
}

TlsReloader::~TlsReloader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_.notify_all();
  if (periodic_.joinable()) periodic_.join();
}

absl::StatusOr<bool> TlsReloader::Reload() {
  std::lock_guard<std::mutex> lock(mu_);
  return ReloadLocked(/*log_repeated_failure=*/true);
}

absl::StatusOr<bool> TlsReloader::ReloadLocked(bool log_repeated_failure) {
  absl::StatusOr<TlsPems> pems = ReadTlsFiles(files_);
  absl::Status published = pems.ok() ? absl::OkStatus() : pems.status();
  const bool changed = pems.ok() && !SamePems(*pems, served_);
  if (changed) published = Publish(*pems);
  if (!published.ok()) {
    const std::string reason(published.message());
    if (log_repeated_failure || reason != last_failure_) {
      log_->Log(LogLevel::kError, "tls_reload_failed",
                {{"reason", reason}, {"kept", "the certificate and key in force"}});
    }
    last_failure_ = reason;
    metrics_->TlsReloaded("failed");
    return published;
  }
  last_failure_.clear();
  if (changed) {
    served_ = *std::move(pems);
    {
      std::lock_guard<std::mutex> served_lock(served_mu_);
      served_snapshot_ = std::make_shared<const TlsPems>(served_);
    }
    metrics_->TlsCertificateServed(served_.not_after);
    metrics_->TlsReloaded("ok");
    log_->Log(
        LogLevel::kInfo, "tls_reloaded",
        {{"cert", files_.cert},
         {"key", files_.key},
         {"expires", absl::FormatTime(absl::RFC3339_sec, served_.not_after, absl::UTCTimeZone())}});
  }
  return changed;
}

absl::Status TlsReloader::Publish(const TlsPems& pems) {
  if (!pems.client_ca.empty())
    KILN_RETURN_IF_ERROR(WriteAtomically(ClientCaPath(), pems.client_ca));
  return WriteAtomically(IdentityPath(), absl::StrCat(pems.key, "\n", pems.cert_chain));
}

std::string TlsReloader::IdentityPath() const { return served_dir_ + "/identity.pem"; }
std::string TlsReloader::ClientCaPath() const { return served_dir_ + "/client_ca.pem"; }

}  // namespace kiln::server
