#include "flaky_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace kiln::client::testing {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  return address;
}

// Writes all of `n` bytes; false when the peer is gone.
bool WriteAll(int fd, const char* data, ssize_t n) {
  while (n > 0) {
    const ssize_t written = send(fd, data, n, MSG_NOSIGNAL);
    if (written <= 0) return false;
    data += written;
    n -= written;
  }
  return true;
}

}  // namespace

FlakyPort::FlakyPort(int target_port) : target_port_(target_port) {
  listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address = Loopback(0);
  socklen_t length = sizeof(address);
  if (listen_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      listen(listen_fd_, 16) != 0 ||
      getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0 ||
      pipe(stop_) != 0) {
    ADD_FAILURE() << "FlakyPort could not listen on 127.0.0.1";
    return;
  }
  port_ = ntohs(address.sin_port);
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

FlakyPort::~FlakyPort() {
  if (stop_[1] >= 0) close(stop_[1]);  // wakes every poll below
  if (acceptor_.joinable()) acceptor_.join();
  for (std::thread& relay : relays_) relay.join();
  if (stop_[0] >= 0) close(stop_[0]);
  if (listen_fd_ >= 0) close(listen_fd_);
}

std::string FlakyPort::address() const { return absl::StrCat("127.0.0.1:", port_); }

void FlakyPort::AcceptLoop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0 || fds[1].revents != 0) return;
    const int client = accept(listen_fd_, nullptr, nullptr);
    if (client < 0) continue;
    if (accepted_.fetch_add(1) == 0) {
      close(client);  // the first attempt fails
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    relays_.emplace_back([this, client] { Relay(client); });
  }
}

void FlakyPort::Relay(int client) {
  const int upstream = socket(AF_INET, SOCK_STREAM, 0);
  const sockaddr_in target = Loopback(target_port_);
  if (upstream >= 0 &&
      connect(upstream, reinterpret_cast<const sockaddr*>(&target), sizeof(target)) == 0) {
    char buffer[16384];
    for (;;) {
      pollfd fds[3] = {{client, POLLIN, 0}, {upstream, POLLIN, 0}, {stop_[0], POLLIN, 0}};
      if (poll(fds, 3, -1) < 0 || fds[2].revents != 0) break;
      const int from = fds[0].revents != 0 ? client : upstream;
      const int to = from == client ? upstream : client;
      const ssize_t n = recv(from, buffer, sizeof(buffer), 0);
      if (n <= 0 || !WriteAll(to, buffer, n)) break;
    }
  }
  if (upstream >= 0) close(upstream);
  close(client);
}

}  // namespace kiln::client::testing
