// The channel to kilnd: server address, TLS, bearer token and a short connect deadline.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"

namespace kiln::client {

// Where and how to reach kilnd; filled from --server/KILN_SERVER, --token/KILN_TOKEN and the
// --tls-* flags (KILN_TLS_*). Any TLS setting turns TLS on; none means plaintext.
struct ConnectionOptions {
  std::string server = "localhost:7070";  // HOST:PORT
  std::string token;                      // sent as "authorization: Bearer TOKEN" when set
  std::string tls_ca;           // PEM file of the CA that signed kilnd's certificate; empty with
                                // TLS on: the system's roots
  std::string tls_cert;         // PEM client certificate, for kilnd with mutual TLS
  std::string tls_key;          // its PEM private key
  std::string tls_server_name;  // the name to verify kilnd's certificate for, when it is not
                                // the host of `server`
  absl::Duration connect_timeout = absl::Seconds(3);

  bool tls() const {
    return !tls_ca.empty() || !tls_cert.empty() || !tls_key.empty() || !tls_server_name.empty();
  }
};

// An open channel to kilnd. Thread-compatible; NewContext may be called from any thread.
class Connection {
 public:
  // Connects, waiting up to options.connect_timeout. An unreachable server is UNAVAILABLE with
  // a message that says why (a dead port, a plaintext/TLS mismatch, a failed TLS handshake) and
  // how to start kilnd. InvalidArgument for an unreadable TLS file or a certificate without its
  // key.
  static absl::StatusOr<std::unique_ptr<Connection>> Open(const ConnectionOptions& options);

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  const std::string& server() const { return options_.server; }

  // A context for one call, carrying the bearer token and, unless infinite, a deadline.
  std::unique_ptr<grpc::ClientContext> NewContext(absl::Duration timeout = absl::Seconds(30)) const;

 private:
  Connection(ConnectionOptions options, std::shared_ptr<grpc::Channel> channel)
      : options_(std::move(options)), channel_(std::move(channel)) {}

  ConnectionOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
};

// Why a channel to a port that accepts TCP connections did not become ready, in words: a
// plaintext/TLS mismatch, a certificate that does not verify or names another host, a refused
// client certificate. `grpc_error` is gRPC's message for a call on that channel.
std::string DescribeConnectFailure(const ConnectionOptions& options, const std::string& grpc_error);

}  // namespace kiln::client
