#include "server/observability/metrics_http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kiln::server {

namespace {

constexpr int kMaxConnections = 8;
constexpr std::chrono::milliseconds kRequestTimeout{5000};
constexpr std::chrono::milliseconds kOutOfDescriptorsWait{100};

absl::Status Unavailable(const std::string& listen, const std::string& what) {
  return absl::UnavailableError(absl::StrCat("--metrics_listen=", listen, ": ", what));
}

// Splits "HOST:PORT" or "[HOST]:PORT".
bool SplitHostPort(const std::string& listen, std::string* host, std::string* port) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon + 1 == listen.size()) return false;
  *host = listen.substr(0, colon);
  *port = listen.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  int p;
  return absl::SimpleAtoi(*port, &p) && p >= 0 && p <= 65535;
}

void WriteAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;
    }
    off += static_cast<size_t>(n);
  }
}

}  // namespace

absl::StatusOr<int> MetricsHttpServer::Start(const std::string& listen) {
  std::string host, port;
  if (!SplitHostPort(listen, &host, &port)) return Unavailable(listen, "not HOST:PORT");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return Unavailable(listen, gai_strerror(rc));
  }
  std::string error = "no address";
  for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 64) == 0) {
      listen_fd_ = fd;
    } else {
      error = std::strerror(errno);
      close(fd);
    }
  }
  freeaddrinfo(found);
  if (listen_fd_ < 0) return Unavailable(listen, error);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (pipe2(wake_fd_, O_CLOEXEC) != 0) {
    close(listen_fd_);
    listen_fd_ = -1;
    return Unavailable(listen, std::strerror(errno));
  }
  thread_ = std::thread(&MetricsHttpServer::Serve, this);
  pthread_setname_np(thread_.native_handle(), "kiln-metrics");
  return bound_port;
}

void MetricsHttpServer::Stop() {
  if (!thread_.joinable()) return;
  const char byte = 0;
  (void)!write(wake_fd_[1], &byte, 1);
  thread_.join();
  {
    // Connections still being answered end within kRequestTimeout.
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [this] { return answering_ == 0; });
  }
  close(listen_fd_);
  close(wake_fd_[0]);
  close(wake_fd_[1]);
  listen_fd_ = wake_fd_[0] = wake_fd_[1] = -1;
}

void MetricsHttpServer::Serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors: the connection stays queued and poll() would wake at once again;
      // wait for descriptors to free instead of spinning a core.
      if (errno == EMFILE || errno == ENFILE) std::this_thread::sleep_for(kOutOfDescriptorsWait);
      continue;
    }
    // Each connection on its own thread, so one slow client holds up no scrape; a few at once
    // at most (Prometheus scrapes one at a time), the rest closed at once.
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (answering_ >= kMaxConnections) {
        close(fd);
        continue;
      }
      ++answering_;
    }
    std::thread([this, fd] {
      Answer(fd);
      close(fd);
      std::lock_guard<std::mutex> lock(mu_);
      if (--answering_ == 0) idle_.notify_all();
    }).detach();
  }
}

void MetricsHttpServer::Answer(int fd) {
  // The request head must arrive whole within kRequestTimeout: a client trickling bytes cannot
  // keep the connection for longer. The answer's writes have the same limit.
  const timeval send_limit{kRequestTimeout.count() / 1000, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_limit, sizeof(send_limit));
  const auto deadline = std::chrono::steady_clock::now() + kRequestTimeout;
  std::string head;
  char buf[2048];
  while (head.find("\r\n\r\n") == std::string::npos && head.size() < 16384) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) return;
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return;
    head.append(buf, static_cast<size_t>(n));
  }
  const size_t line_end = head.find("\r\n");
  const std::string line = head.substr(0, line_end);
  std::string status = "200 OK", type = "text/plain; version=0.0.4; charset=utf-8", body;
  if (line.rfind("GET ", 0) != 0 && line.rfind("HEAD ", 0) != 0) {
    status = "405 Method Not Allowed";
    body = "only GET /metrics\n";
  } else {
    const size_t start = line.find(' ') + 1;
    const std::string path = line.substr(start, line.find(' ', start) - start);
    if (path == "/metrics" || path.rfind("/metrics?", 0) == 0) {
      body = body_();
    } else {
      status = "404 Not Found";
      type = "text/plain";
      body = "kilnd serves metrics at /metrics\n";
    }
  }
  std::string response =
      absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type,
                   "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n");
  if (line.rfind("HEAD ", 0) != 0) response += body;
  WriteAll(fd, response);
}

}  // namespace kiln::server
