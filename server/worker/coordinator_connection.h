// kiln-worker's channel to kilnd (the coordinator): its address, TLS as the kiln CLI offers it
// (client/connection.h), and the job's worker token on every call.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "kiln/v1/worker.grpc.pb.h"

namespace kiln::worker {

// The metadata header that carries the worker token (worker.proto).
inline constexpr char kWorkerTokenHeader[] = "x-kiln-worker-token";

struct CoordinatorOptions {
  std::string address;                                     // HOST:PORT
  std::string token;                                       // the attempt's worker token
  std::string tls_ca, tls_cert, tls_key, tls_server_name;  // any set: TLS
  // How long Open waits for kilnd to answer: workers of a Kubernetes Indexed Job may start
  // before kilnd's address is reachable.
  absl::Duration connect_timeout = absl::Seconds(30);

  bool tls() const {
    return !tls_ca.empty() || !tls_cert.empty() || !tls_key.empty() || !tls_server_name.empty();
  }
};

// Thread-safe: NewContext and the stub may be used from any thread.
class CoordinatorConnection {
 public:
  // Connects, waiting up to options.connect_timeout. Unavailable naming the address when kilnd
  // does not answer; InvalidArgument for an unreadable TLS file.
  static absl::StatusOr<std::unique_ptr<CoordinatorConnection>> Open(
      const CoordinatorOptions& options);

  v1::Workers::Stub& stub() { return *stub_; }
  const std::string& address() const { return options_.address; }

  // A context for one call, carrying the worker token and, unless infinite, a deadline.
  std::unique_ptr<grpc::ClientContext> NewContext(absl::Duration timeout) const;

 private:
  CoordinatorConnection(CoordinatorOptions options, std::shared_ptr<grpc::Channel> channel)
      : options_(std::move(options)),
        channel_(std::move(channel)),
        stub_(v1::Workers::NewStub(channel_)) {}

  CoordinatorOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Workers::Stub> stub_;
};

// A gRPC status as an absl::Status of the same code, its message prefixed with `what`.
absl::Status FromGrpc(const grpc::Status& status, const std::string& what);

}  // namespace kiln::worker
