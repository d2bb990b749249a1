#include "server/grpc/connection_guard.h"

#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>
#include <utility>
#include <vector>

namespace kiln::server {

struct ConnectionGuard::State {
  int port;
  ConnectionLimits limits;
  RefusedFn on_refused;
  int descriptor_limit;  // the soft RLIMIT_NOFILE when installed
  // Accepted connections by descriptor and inode: a descriptor gRPC has closed (or reused for
  // something else) no longer matches, and is pruned before each count.
  std::vector<std::pair<int, ino_t>> open;
};

namespace {

// Every installed guard; the registry's mutex also keeps a guard alive while an accept uses it.
std::mutex registry_mu;
std::vector<ConnectionGuard::State*>& Registry() {
  static auto* guards = new std::vector<ConnectionGuard::State*>();
  return *guards;
}
std::atomic<int> installed{0};

using Accept4Fn = int (*)(int, sockaddr*, socklen_t*, int);
Accept4Fn RealAccept4() {
  static const Accept4Fn real = reinterpret_cast<Accept4Fn>(dlsym(RTLD_NEXT, "accept4"));
  return real;
}

int LocalPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return -1;
}

ino_t InodeOf(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) ? st.st_ino : 0;
}

void PruneClosed(ConnectionGuard::State* guard) {
  auto& open = guard->open;
  open.erase(
      std::remove_if(open.begin(), open.end(),
                     [](const std::pair<int, ino_t>& c) { return InodeOf(c.first) != c.second; }),
      open.end());
}

// Called with registry_mu held for a connection `fd` accepted on `guard`'s port: keeps it
// (returns true) or says why it must be closed.
bool Admit(ConnectionGuard::State* guard, int fd, const char** reason) {
  PruneClosed(guard);
  *reason = RefuseConnection(fd, static_cast<int>(guard->open.size()), guard->descriptor_limit,
                             guard->limits);
  if (*reason != nullptr) return false;
  guard->open.emplace_back(fd, InodeOf(fd));
  return true;
}

ConnectionGuard::State* GuardOf(int listen_fd) {
  const int port = LocalPort(listen_fd);
  for (ConnectionGuard::State* g : Registry()) {
    if (g->port == port) return g;
  }
  return nullptr;
}

}  // namespace

std::unique_ptr<ConnectionGuard> ConnectionGuard::Install(int port, ConnectionLimits limits,
                                                          RefusedFn on_refused) {
  auto* state = new State{port, limits, std::move(on_refused), OpenFileLimit(), {}};
  KeepSpareDescriptor();
  std::lock_guard<std::mutex> lock(registry_mu);
  Registry().push_back(state);
  installed.fetch_add(1);
  return std::unique_ptr<ConnectionGuard>(new ConnectionGuard(state));
}

ConnectionGuard::~ConnectionGuard() {
  {
    std::lock_guard<std::mutex> lock(registry_mu);
    auto& guards = Registry();
    guards.erase(std::remove(guards.begin(), guards.end(), state_), guards.end());
    installed.fetch_sub(1);
  }
  delete state_;
}

int ConnectionGuard::open_connections() const {
  std::lock_guard<std::mutex> lock(registry_mu);
  PruneClosed(state_);
  return static_cast<int>(state_->open.size());
}

}  // namespace kiln::server

// The process's accept4 (see connection_guard.h). Refusing reports EAGAIN, which gRPC takes as
// "nothing more to accept now"; every pending connection has been taken off the queue by then,
// so no connection waits for an edge-triggered wake-up that never comes.
extern "C" int accept4(int fd, sockaddr* __restrict addr, socklen_t* __restrict len, int flags) {
  using kiln::server::ConnectionGuard;
  const auto real = kiln::server::RealAccept4();
  if (kiln::server::installed.load(std::memory_order_relaxed) == 0) {
    return real(fd, addr, len, flags);
  }
  for (;;) {
    const int conn = real(fd, addr, len, flags);
    const int error = errno;
    if (conn < 0 && error != EMFILE && error != ENFILE) return conn;
    std::unique_lock<std::mutex> lock(kiln::server::registry_mu);
    ConnectionGuard::State* guard = kiln::server::GuardOf(fd);
    if (guard == nullptr) {
      errno = error;
      return conn;
    }
    const char* reason = "descriptors";
    if (conn >= 0) {
      if (kiln::server::Admit(guard, conn, &reason)) return conn;
      close(conn);
    } else if (!kiln::DrainPendingConnection(fd, real)) {
      // Out of descriptors, and the spare one could not take the connection off the queue.
      errno = EAGAIN;
      return -1;
    }
    if (guard->on_refused) guard->on_refused(reason);
  }
}
