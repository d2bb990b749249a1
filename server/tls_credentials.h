// kilnd's gRPC server credentials from its --tls_* flags: plaintext, TLS, or mutual TLS. The PEM
// files are read and checked here, so a wrong path or a key that does not fit its certificate is
// a startup error naming the flag, not a server that silently fails to bind.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace grpc {
class ServerCredentials;
}

namespace kiln::server {

struct TlsFiles {
  std::string cert;       // --tls_cert: PEM certificate chain, the server's own first
  std::string key;        // --tls_key: PEM private key of that certificate, unencrypted
  std::string client_ca;  // --tls_client_ca: PEM CA(s) that client certificates must chain to
};

enum class TlsMode { kOff, kTls, kMutualTls };

// kOff with no file set, kTls with cert and key, kMutualTls with all three.
TlsMode TlsModeOf(const TlsFiles& files);
// "off", "tls" or "mutual".
const char* TlsModeName(TlsMode mode);

// Insecure credentials when no file is set; TLS with cert and key; with client_ca too, TLS that
// requires a client certificate and verifies it against client_ca. InvalidArgument naming the
// flag when only one of cert and key is given, client_ca comes without them, a file cannot be
// read or holds no PEM of its kind, the key does not match the certificate, or the certificate
// has expired.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files);

}  // namespace kiln::server
