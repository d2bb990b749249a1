#include "server/worker/coordinator_connection.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/channel_credentials.h"
#include "common/status_macros.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace kiln::worker {
namespace {

std::chrono::system_clock::time_point DeadlineIn(absl::Duration timeout) {
  return std::chrono::system_clock::now() +
         std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorConnection>> CoordinatorConnection::Open(
    const CoordinatorOptions& options) {
  ClientTlsFiles tls;
  tls.tls = options.tls();
  tls.ca = options.tls_ca;
  tls.cert = options.tls_cert;
  tls.key = options.tls_key;
  tls.ca_flag = "tls_ca";
  tls.cert_flag = "tls_cert";
  tls.key_flag = "tls_key";
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                        MakeChannelCredentials(tls));
  grpc::ChannelArguments arguments;
  if (!options.tls_server_name.empty()) {
    arguments.SetSslTargetNameOverride(options.tls_server_name);
  }
  // Reports and checkpoints are long-lived streams: keepalives notice a vanished kilnd (a node
  // that went away without closing the connection) instead of waiting on it for ever.
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20'000);
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10'000);
  arguments.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(options.address, credentials, arguments);
  // Unlike the CLI, keep trying through transient failures until the deadline: kilnd may not
  // be reachable yet when a worker starts.
  if (!channel->WaitForConnected(DeadlineIn(options.connect_timeout))) {
    return absl::UnavailableError(absl::StrCat(
        "cannot reach kilnd at ", options.address, " within ",
        absl::FormatDuration(options.connect_timeout),
        options.tls() ? " (is it serving TLS with a certificate --tls_ca verifies?)"
                      : " (is it running, and serving plaintext? with TLS pass --tls_ca)"));
  }
  return std::unique_ptr<CoordinatorConnection>(
      new CoordinatorConnection(options, std::move(channel)));
}

std::unique_ptr<grpc::ClientContext> CoordinatorConnection::NewContext(
    absl::Duration timeout) const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->AddMetadata(kWorkerTokenHeader, options_.token);
  if (timeout != absl::InfiniteDuration()) context->set_deadline(DeadlineIn(timeout));
  return context;
}

absl::Status FromGrpc(const grpc::Status& status, const std::string& what) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, ": ", status.error_message()));
}

}  // namespace kiln::worker
