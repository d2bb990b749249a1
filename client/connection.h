// The channel to kilnd: server address, TLS, bearer token and a short connect deadline.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"

namespace kiln::client {

// Where and how to reach kilnd; filled from --server/KILN_SERVER, --token/KILN_TOKEN, --tls-ca.
struct ConnectionOptions {
  std::string server = "localhost:7070";  // HOST:PORT
  std::string token;                      // sent as "authorization: Bearer TOKEN" when set
  std::string tls_ca;                     // PEM file of the CA; empty means plaintext
  absl::Duration connect_timeout = absl::Seconds(3);
};

// An open channel to kilnd. Thread-compatible; NewContext may be called from any thread.
class Connection {
 public:
  // Connects, waiting up to options.connect_timeout. An unreachable server is UNAVAILABLE with
  // a message that says why and how to start kilnd.
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

}  // namespace kiln::client
