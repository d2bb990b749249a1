// The rule every listener of kilnd (gRPC's, the HTTP port's) applies to the connections it
// accepts, so that no port can take the descriptors the rest of the process needs: at most
// max_connections open, none whose descriptor eats into the reserve kept below the open-file
// limit for job, dataset and store files, at most its share of the descriptors above the
// reserve (so that a flood of one port leaves the other its own), and a spare descriptor to take
// a pending connection off the queue when accept fails for want of descriptors (so the listener
// never stalls on EMFILE with connections piling up in its backlog).
#pragma once

#include <sys/socket.h>

namespace kiln {

// Raises the soft RLIMIT_NOFILE to the hard limit; returns the soft limit in force after.
int RaiseOpenFileLimit();

// The soft RLIMIT_NOFILE now, capped at 2^30.
int OpenFileLimit();

struct ListenerLimits {
  int max_connections = 1000;     // connections open at once on the port
  int reserved_descriptors = 64;  // below the open-file limit, never used for connections
  // The descriptors above the reserve are split this many ways, one part per listener of the
  // process (kilnd has two: gRPC and HTTP); a listener's connections take at most one part.
  int descriptor_shares = 2;
};

// Why the connection just accepted as descriptor `fd` must be closed at once, or null to keep
// it: "descriptors" when `fd` lies in the reserve below `descriptor_limit` (the lowest free
// descriptor is that high) or `open` connections already hold the listener's share of the
// descriptors above it, "max_connections" when `open` connections (not counting this one) are
// already open.
const char* RefuseConnection(int fd, int open, int descriptor_limit, const ListenerLimits& limits);

// The most connections a listener keeps open under `descriptor_limit`: max_connections, or its
// share of the descriptors above the reserve when that is fewer.
int ConnectionCap(int descriptor_limit, const ListenerLimits& limits);

using AcceptFn = int (*)(int, sockaddr*, socklen_t*, int);

// Opens the spare descriptor DrainPendingConnection gives up, unless open already; a listener
// calls it when it starts, while descriptors are free. Thread-safe.
void KeepSpareDescriptor();

// For a listener whose accept just failed with EMFILE or ENFILE: gives up the process's spare
// descriptor, accepts one pending connection on `listen_fd` with `accept_fn` and closes it, then
// takes the spare back. True when a connection was taken off the queue. Thread-safe.
bool DrainPendingConnection(int listen_fd, AcceptFn accept_fn);

}  // namespace kiln
