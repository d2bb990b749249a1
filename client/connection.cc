#include "client/connection.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/channel_credentials.h"
#include "common/status_macros.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace kiln::client {
namespace {

// Splits "host:port" or "[v6]:port"; false for other target forms (unix:, dns:///...).
bool SplitHostPort(const std::string& target, std::string* host, std::string* port) {
  if (absl::StrContains(target, "://") || absl::StartsWith(target, "unix:")) return false;
  if (absl::StartsWith(target, "[")) {
    const size_t close = target.find("]:");
    if (close == std::string::npos) return false;
    *host = target.substr(1, close - 1);
    *port = target.substr(close + 2);
    return true;
  }
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  *host = target.substr(0, colon);
  *port = target.substr(colon + 1);
  return true;
}

// Why a TCP connection to `target` fails ("connection refused"), or empty when it succeeds or the
// target is not HOST:PORT. Tells a dead port apart from a gRPC or TLS mismatch.
std::string TcpFailure(const std::string& target, absl::Duration timeout) {
  std::string host, port;
  if (!SplitHostPort(target, &host, &port)) return "";
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
    return absl::StrCat("cannot resolve host \"", host, "\"");
  }
  std::string failure = "connection timed out";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int err = 0;
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) == 1) {
          socklen_t len = sizeof(err);
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        } else {
          err = ETIMEDOUT;
        }
      }
    }
    close(fd);
    if (err == 0) {
      failure.clear();
      break;
    }
    failure = absl::AsciiStrToLower(std::strerror(err));
  }
  freeaddrinfo(found);
  return failure;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeCredentials(
    const ConnectionOptions& options) {
  if (options.tls() && options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key go together: the client certificate and its private key");
  }
  ClientTlsFiles tls;
  tls.tls = options.tls();
  tls.ca = options.tls_ca;
  tls.cert = options.tls_cert;
  tls.key = options.tls_key;
  return MakeChannelCredentials(tls);
}

// What gRPC says about a channel that would not connect ("... Ssl handshake failed: ...
// CERTIFICATE_VERIFY_FAILED"), asked through a health check that fails fast.
std::string GrpcConnectError(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, grpc::health::v1::HealthCheckRequest(), &response);
  return status.ok() ? "" : status.error_message();
}

// A channel of its own to kilnd: with a local subchannel pool, so that a second channel makes a
// new connection attempt instead of sharing the first one's subchannel and its backoff.
std::shared_ptr<grpc::Channel> NewChannel(const ConnectionOptions& options,
                                          const std::shared_ptr<grpc::ChannelCredentials>& creds) {
  grpc::ChannelArguments arguments;
  arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (!options.tls_server_name.empty()) {
    arguments.SetSslTargetNameOverride(options.tls_server_name);
  }
  return grpc::CreateCustomChannel(options.server, creds, arguments);
}

// Waits for READY, but gives up at the first TRANSIENT_FAILURE (every address failed) rather
// than letting gRPC retry until the deadline: a dead port answers at once.
grpc_connectivity_state AwaitReadyOrFailure(grpc::Channel& channel,
                                            std::chrono::system_clock::time_point deadline) {
  grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY && state != GRPC_CHANNEL_TRANSIENT_FAILURE &&
         state != GRPC_CHANNEL_SHUTDOWN && channel.WaitForStateChange(state, deadline)) {
    state = channel.GetState(/*try_to_connect=*/true);
  }
  return state;
}

}  // namespace

std::string DescribeConnectFailure(const ConnectionOptions& options,
                                   const std::string& grpc_error) {
  if (!options.tls()) {
    return "the port answers but not as a plaintext gRPC server (does kilnd serve TLS? pass "
           "--tls-ca with the CA of its certificate)";
  }
  std::string host, port;
  if (!options.tls_server_name.empty()) {
    host = options.tls_server_name;
  } else if (!SplitHostPort(options.server, &host, &port)) {
    host = options.server;
  }
  const std::string lower = absl::AsciiStrToLower(grpc_error);
  if (absl::StrContains(lower, "certificate verify failed")) {
    return absl::StrCat("the TLS handshake failed: kilnd's certificate does not verify against ",
                        options.tls_ca.empty()
                            ? "the system's CAs (pass --tls-ca with the CA that signed it)"
                            : absl::StrCat("the CA in --tls-ca ", options.tls_ca));
  }
  if (absl::StrContains(lower, "not in peer certificate")) {
    return absl::StrCat("the TLS handshake failed: kilnd's certificate is not for \"", host,
                        "\" (pass --tls-server-name with a name the certificate holds)");
  }
  if (absl::StrContains(lower, "wrong version number") ||
      absl::StrContains(lower, "packet length too long") ||
      absl::StrContains(lower, "record layer failure")) {
    return "the port answers but not with TLS (kilnd serves plaintext there: drop --tls-ca, "
           "--tls-cert, --tls-key and --tls-server-name)";
  }
  if (absl::StrContains(lower, "socket closed") || absl::StrContains(lower, "connection reset") ||
      absl::StrContains(lower, "handshake read failed") ||
      absl::StrContains(lower, "unexpected eof")) {
    return options.tls_cert.empty()
               ? "kilnd closed the connection during the TLS handshake (does it require a client "
                 "certificate? pass --tls-cert and --tls-key)"
               : "kilnd closed the connection during the TLS handshake (did it refuse the client "
                 "certificate? it must chain to kilnd's --tls_client_ca)";
  }
  // Anything else: gRPC's own words, without its "failed to connect to all addresses" preamble.
  std::string detail = grpc_error;
  if (const size_t last = detail.find("last error: "); last != std::string::npos) {
    detail = detail.substr(last + std::string("last error: ").size());
  }
  return absl::StrCat("the TLS handshake failed",
                      detail.empty() ? std::string() : absl::StrCat(": ", detail));
}

absl::StatusOr<std::unique_ptr<Connection>> Connection::Open(const ConnectionOptions& options) {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                        MakeCredentials(options));
  const auto deadline =
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(absl::ToInt64Milliseconds(options.connect_timeout));
  std::shared_ptr<grpc::Channel> channel = NewChannel(options, credentials);
  grpc_connectivity_state state = AwaitReadyOrFailure(*channel, deadline);
  if (state == GRPC_CHANNEL_READY) {
    return std::unique_ptr<Connection>(new Connection(options, std::move(channel)));
  }
  const std::string tcp_failure = TcpFailure(options.server, options.connect_timeout);
  if (!tcp_failure.empty()) {
    return absl::UnavailableError(absl::StrCat("cannot reach kilnd at ", options.server, ": ",
                                               tcp_failure,
                                               " (is kilnd running? start it with: kilnd --listen ",
                                               options.server, " --state_dir DIR --data_dir DIR)"));
  }
  // Something listens, so the failed attempt may have been gRPC's own: Debian 12's gRPC 1.51 now
  // and then takes an in-progress connect for a failed one (a stale errno, grpc/grpc#35064). A
  // second attempt on a fresh channel (a fresh subchannel, not one in backoff) tells that apart
  // from a real mismatch, which fails again at once.
  if (state == GRPC_CHANNEL_TRANSIENT_FAILURE) {
    channel = NewChannel(options, credentials);
    state = AwaitReadyOrFailure(*channel, deadline);
    if (state == GRPC_CHANNEL_READY) {
      return std::unique_ptr<Connection>(new Connection(options, std::move(channel)));
    }
  }
  // The trouble is between plaintext and TLS, or in the handshake.
  return absl::UnavailableError(
      absl::StrCat("cannot reach kilnd at ", options.server, ": ",
                   DescribeConnectFailure(options, GrpcConnectError(channel))));
}

std::unique_ptr<grpc::ClientContext> Connection::NewContext(absl::Duration timeout) const {
  auto context = std::make_unique<grpc::ClientContext>();
  if (!options_.token.empty()) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", options_.token));
  }
  if (timeout != absl::InfiniteDuration()) {
    context->set_deadline(std::chrono::system_clock::now() +
                          std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
  }
  return context;
}

}  // namespace kiln::client
