// kilnd's TLS files from its --tls_* flags: plaintext, TLS, or mutual TLS. The PEM files are read
// and checked here, so a wrong path or a key that does not fit its certificate is an error naming
// the flag (at start: kilnd exits; on a reload: the files in force stay), not a server that
// silently fails its handshakes. server/tls_reloader serves them.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

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

// The checked contents of a TlsFiles.
struct TlsPems {
  std::string cert_chain;
  std::string key;
  std::string client_ca;  // empty without mutual TLS
  absl::Time not_after;   // when the certificate (the chain's first) expires
};

// Reads and checks the files of a TLS or mutual TLS setting (not kOff). InvalidArgument naming the
// flag when only one of cert and key is given, client_ca comes without them, a file cannot be
// read or holds no PEM of its kind, the key does not match the certificate, or the certificate
// has expired.
absl::StatusOr<TlsPems> ReadTlsFiles(const TlsFiles& files);

}  // namespace kiln::server
