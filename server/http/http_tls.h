// TLS for the HTTP listener with the certificate renewed without a restart: an OpenSSL
// certificate callback hands each new handshake the set in force (as gRPC's file watcher does
// for the gRPC port), instead of the certificate fixed into httplib's SSL_CTX at start.
#pragma once

#include <functional>
#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "server/http/http_server.h"

typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_st SSL;

namespace kiln::http {

class TlsHandshakeIdentity {
 public:
  // `current` returns the PEMs in force; called at each handshake (so it must be cheap and
  // thread-safe). Parsed sets are cached until the PEMs change.
  explicit TlsHandshakeIdentity(std::function<HttpTlsPems()> current)
      : current_(std::move(current)) {}

  // Checks that the PEMs in force load, and sets `ctx` up to serve them: the certificate
  // callback, and with a client CA, client certificates required and verified against it.
  // This object must outlive every connection made with `ctx`.
  absl::Status Install(SSL_CTX* ctx);

 private:
  struct Loaded;
  static int OnCertificate(SSL* ssl, void* self);
  // The parsed set in force; InvalidArgument when it does not load.
  absl::StatusOr<std::shared_ptr<const Loaded>> Current();

  const std::function<HttpTlsPems()> current_;
  std::mutex mu_;
  HttpTlsPems loaded_pems_;               // guarded by mu_: what loaded_ was parsed from
  std::shared_ptr<const Loaded> loaded_;  // guarded by mu_
};

}  // namespace kiln::http
