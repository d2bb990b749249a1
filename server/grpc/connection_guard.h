// Keeps kilnd's gRPC listener alive and its descriptors in reserve when clients open more
// connections than it can hold.
//
// Why this exists: gRPC 1.51 (Debian 12's) stops its listener for good when accept4 fails with
// EMFILE, and has no connection limit. The guard wraps accept4 for the process (the symbol
// defined in connection_guard.cc interposes libc's; calls on sockets not guarded pass straight
// through) and, on a guarded listening port:
// - closes at once a new connection past `max_connections` open ones, or whose descriptor would
//   eat into the `reserved_descriptors` kept for job and store file I/O;
// - on EMFILE, frees its one spare descriptor to accept and close the pending connection, so the
//   listener never sees the error and accepting resumes as soon as descriptors free up.
// The refused client sees its connection closed and retries (gRPC channels back off). Newer gRPC
// retries accept after EMFILE and has a connection cap; with it this can go. The rule itself (cap,
// reserve, spare descriptor) is common/descriptor_budget.h, which the HTTP port applies too.
#pragma once

#include <functional>
#include <memory>

#include "common/descriptor_budget.h"

namespace kiln::server {

using ::kiln::RaiseOpenFileLimit;
using ConnectionLimits = ::kiln::ListenerLimits;

class ConnectionGuard {
 public:
  // Why a connection was refused: "max_connections" or "descriptors".
  using RefusedFn = std::function<void(const char* reason)>;

  // Guards every listening socket bound to `port` until the guard is destroyed. `on_refused` is
  // called on gRPC's accepting thread for each connection closed; it must not block.
  static std::unique_ptr<ConnectionGuard> Install(int port, ConnectionLimits limits,
                                                  RefusedFn on_refused);
  ~ConnectionGuard();
  ConnectionGuard(const ConnectionGuard&) = delete;
  ConnectionGuard& operator=(const ConnectionGuard&) = delete;

  // Connections accepted on the port and still open.
  int open_connections() const;

  struct State;  // connection_guard.cc

 private:
  explicit ConnectionGuard(State* state) : state_(state) {}
  State* state_;
};

}  // namespace kiln::server
