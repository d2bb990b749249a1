#include "client/connection.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

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

}  // namespace

absl::StatusOr<std::unique_ptr<Connection>> Connection::Open(const ConnectionOptions& options) {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (options.tls_ca.empty()) {
    credentials = grpc::InsecureChannelCredentials();
  } else {
    std::ifstream in(options.tls_ca, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("--tls-ca: cannot read ", options.tls_ca));
    std::ostringstream pem;
    pem << in.rdbuf();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = pem.str();
    credentials = grpc::SslCredentials(ssl);
  }
  std::shared_ptr<grpc::Channel> channel = grpc::CreateChannel(options.server, credentials);
  const auto deadline =
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(absl::ToInt64Milliseconds(options.connect_timeout));
  // Waits for READY, but gives up at the first TRANSIENT_FAILURE (every address refused) rather
  // than letting gRPC retry until the deadline: a dead port answers at once.
  grpc_connectivity_state state = channel->GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY && state != GRPC_CHANNEL_TRANSIENT_FAILURE &&
         state != GRPC_CHANNEL_SHUTDOWN && channel->WaitForStateChange(state, deadline)) {
    state = channel->GetState(/*try_to_connect=*/true);
  }
  if (state != GRPC_CHANNEL_READY) {
    std::string why = TcpFailure(options.server, options.connect_timeout);
    if (why.empty()) {
      why = options.tls_ca.empty()
                ? "the port answers but not as a gRPC server (does it want TLS? pass --tls-ca)"
                : "the port answers but the TLS handshake failed (check --tls-ca and the name)";
    }
    return absl::UnavailableError(absl::StrCat("cannot reach kilnd at ", options.server, ": ", why,
                                               " (is kilnd running? start it with: kilnd --listen ",
                                               options.server, " --state_dir DIR --data_dir DIR)"));
  }
  return std::unique_ptr<Connection>(new Connection(options, std::move(channel)));
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
