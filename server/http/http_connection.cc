#include "server/http/http_connection.h"

#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace kiln::http {
namespace {

constexpr size_t kReadChunk = 16 << 10;
// Consumed input is dropped from the front once this much has gathered (or all is consumed).
constexpr size_t kCompactAt = 64 << 10;

Connection::Io SslIo(SSL* ssl, int result) {
  switch (SSL_get_error(ssl, result)) {
    case SSL_ERROR_WANT_READ:
      return Connection::Io::kWantRead;
    case SSL_ERROR_WANT_WRITE:
      return Connection::Io::kWantWrite;
    case SSL_ERROR_ZERO_RETURN:
      return Connection::Io::kClosed;
    default:
      ERR_clear_error();
      return Connection::Io::kError;
  }
}

void IpAndPort(const sockaddr_storage& addr, socklen_t len, std::string& ip, int& port) {
  char host[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof(host), nullptr, 0,
                  NI_NUMERICHOST) == 0) {
    ip = host;
  }
  if (addr.ss_family == AF_INET) {
    port = ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    port = ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
  }
}

const char* Reason(int status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 408:
      return "Request Timeout";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

}  // namespace

std::string ClosingAnswer(int status, std::string_view message, std::string_view extra_headers) {
  const std::string body = nlohmann::json{{"error", std::string(message)}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
  return absl::StrCat("HTTP/1.1 ", status, " ", Reason(status),
                      "\r\nContent-Type: application/json\r\nContent-Length: ", body.size(),
                      "\r\nConnection: close\r\n", std::string(extra_headers), "\r\n", body);
}

Connection::~Connection() {
  if (ssl_ != nullptr) {
    // One non-blocking close_notify at most: a peer that does not read it is not waited for.
    if (clean_close_) SSL_shutdown(ssl_);
    SSL_free(ssl_);
    ERR_clear_error();
  }
  close(fd_);
  if (open_ != nullptr) open_->fetch_sub(1);
}

Connection::Io Connection::Handshake() {
  ERR_clear_error();
  const int result = SSL_accept(ssl_);
  return result == 1 ? Io::kDone : SslIo(ssl_, result);
}

Connection::Io Connection::ReadSome(size_t most) {
  if (consumed_ == input_.size()) {
    input_.clear();
    consumed_ = 0;
  } else if (consumed_ >= kCompactAt) {
    input_.erase(0, consumed_);
    consumed_ = 0;
  }
  // Read onto the stack and appended: growing input_ to read into would zero-fill it first.
  char buffer[kReadChunk];
  most = std::min(most, sizeof(buffer));
  if (ssl_ != nullptr) {
    ERR_clear_error();
    const int n = SSL_read(ssl_, buffer, static_cast<int>(most));
    if (n <= 0) return SslIo(ssl_, n);
    input_.append(buffer, static_cast<size_t>(n));
    return Io::kDone;
  }
  for (;;) {
    const ssize_t n = recv(fd_, buffer, most, MSG_DONTWAIT);
    if (n > 0) {
      input_.append(buffer, static_cast<size_t>(n));
      return Io::kDone;
    }
    if (n == 0) return Io::kClosed;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK ? Io::kWantRead : Io::kError;
  }
}

Connection::Io Connection::WriteSome(const char* data, size_t n, size_t* written) {
  *written = 0;
  if (ssl_ != nullptr) {
    ERR_clear_error();
    const int w = SSL_write(ssl_, data, static_cast<int>(std::min<size_t>(n, INT_MAX)));
    if (w > 0) {
      *written = static_cast<size_t>(w);
      return Io::kDone;
    }
    return SslIo(ssl_, w);
  }
  for (;;) {
    const ssize_t w = send(fd_, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w >= 0) {
      *written = static_cast<size_t>(w);
      return Io::kDone;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Io::kWantWrite;
    return errno == EPIPE || errno == ECONNRESET ? Io::kClosed : Io::kError;
  }
}

bool Connection::Wait(short events, Clock::time_point deadline) const {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd_, events, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, INT_MAX)));
    if (ready > 0) return true;  // ready, or an error the next read or write reports
    if (ready < 0 && errno != EINTR) return false;
  }
}

void Connection::WriteWithoutWaiting(const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    size_t written = 0;
    if (WriteSome(text.data() + done, text.size() - done, &written) != Io::kDone) return;
    done += written;
  }
}

void Connection::Shutdown() const { shutdown(fd_, SHUT_RDWR); }

void Connection::ResetOnClose() const {
  const linger reset{1, 0};
  setsockopt(fd_, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
}

void Connection::ShutdownWrites() {
  if (ssl_ != nullptr) {
    ERR_clear_error();
    SSL_shutdown(ssl_);
    ERR_clear_error();
    clean_close_ = false;  // sent already
  }
  shutdown(fd_, SHUT_WR);
}

void Connection::Consume(size_t n) {
  consumed_ += n;
  if (consumed_ == input_.size()) {
    input_.clear();
    consumed_ = 0;
  }
}

bool ConnectionStream::is_readable() const {
  if (c_.unconsumed() > 0 || (c_.ssl() != nullptr && SSL_pending(c_.ssl()) > 0)) return true;
  return c_.Wait(POLLIN, Clock::now() + timeouts_.io_timeout);
}

bool ConnectionStream::is_writable() const {
  return !write_failed_ && c_.Wait(POLLOUT, Clock::now() + timeouts_.io_timeout);
}

bool ConnectionStream::Fill() {
  for (;;) {
    const Connection::Io io = c_.ReadSome(kReadChunk);
    if (io == Connection::Io::kDone) return true;
    if (io != Connection::Io::kWantRead && io != Connection::Io::kWantWrite) return false;
    const Clock::time_point deadline =
        std::min(timeouts_.body_deadline, Clock::now() + timeouts_.io_timeout);
    if (!c_.Wait(io == Connection::Io::kWantRead ? POLLIN : POLLOUT, deadline)) {
      timed_out_ = true;
      return false;
    }
  }
}

ssize_t ConnectionStream::read(char* ptr, size_t size) {
  if (size == 0) return 0;
  if (c_.head_left > 0) {
    // The head is in input() already: the listener waited for all of it.
    const size_t n = std::min({size, c_.head_left, c_.unconsumed()});
    std::memcpy(ptr, c_.input().data() + c_.consumed(), n);
    c_.Consume(n);
    c_.head_left -= n;
    return static_cast<ssize_t>(n);
  }
  RequestMeter& meter = *c_.meter;
  if (meter.state() == RequestMeter::State::kDone) return 0;
  if (meter.state() != RequestMeter::State::kBody) return -1;
  if (c_.unconsumed() == 0 && !Fill()) return -1;
  const ptrdiff_t n =
      meter.TakeBody(c_.input().data() + c_.consumed(), std::min(size, c_.unconsumed()));
  if (n <= 0) return n;
  std::memcpy(ptr, c_.input().data() + c_.consumed(), static_cast<size_t>(n));
  c_.Consume(static_cast<size_t>(n));
  return n;
}

ssize_t ConnectionStream::write(const char* ptr, size_t size) {
  size_t done = 0;
  const Clock::time_point now = Clock::now();
  if (timeouts_.answer_timeout.has_value() && !answer_deadline_.has_value()) {
    answer_deadline_ = now + *timeouts_.answer_timeout;
  }
  Clock::time_point progress = now + timeouts_.io_timeout;
  while (done < size && !write_failed_) {
    size_t written = 0;
    const Connection::Io io = c_.WriteSome(ptr + done, size - done, &written);
    if (io == Connection::Io::kDone) {
      done += written;
      written_ += static_cast<int64_t>(written);
      progress = Clock::now() + timeouts_.io_timeout;
      continue;
    }
    const Clock::time_point wait_start = Clock::now();
    Clock::time_point deadline = std::min(progress, wait_start + WriteWaitLeft());
    if (answer_deadline_.has_value()) deadline = std::min(deadline, *answer_deadline_);
    if ((io != Connection::Io::kWantWrite && io != Connection::Io::kWantRead) ||
        !c_.Wait(io == Connection::Io::kWantWrite ? POLLOUT : POLLIN, deadline)) {
      write_failed_ = true;
    }
    write_waited_ += Clock::now() - wait_start;
  }
  return write_failed_ ? -1 : static_cast<ssize_t>(size);
}

Clock::duration ConnectionStream::WriteWaitLeft() const {
  const auto earned = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(static_cast<double>(written_) /
                                    static_cast<double>(std::max<int64_t>(1, timeouts_.min_read_rate))));
  return std::max(Clock::duration::zero(), timeouts_.write_wait_grace + earned - write_waited_);
}

void ConnectionStream::get_remote_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(c_.fd(), reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    IpAndPort(addr, len, ip, port);
  }
}

void ConnectionStream::get_local_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(c_.fd(), reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    IpAndPort(addr, len, ip, port);
  }
}

}  // namespace kiln::http
