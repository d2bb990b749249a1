// gRPC channel credentials for a client of kilnd (the CLI, kiln-worker) from PEM files: plaintext
// when no TLS setting is given, else TLS with the given CA (gRPC's default roots without one) and
// an optional client certificate for mutual TLS. A file that cannot be read is an error naming
// the flag that gave it. A library of its own (kiln_channel_credentials): kiln_common links no
// gRPC.
#pragma once

#include <grpcpp/security/credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kiln {

struct ClientTlsFiles {
  bool tls = false;  // any TLS setting given
  std::string ca, cert, key;
  // The flags that gave them, as the program spells them ("tls-ca" or "tls_ca"), for messages.
  const char* ca_flag = "tls-ca";
  const char* cert_flag = "tls-cert";
  const char* key_flag = "tls-key";
};

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientTlsFiles& files);

}  // namespace kiln
