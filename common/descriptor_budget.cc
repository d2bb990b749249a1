#include "common/descriptor_budget.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>

namespace kiln {
namespace {

constexpr rlim_t kMostDescriptors = rlim_t{1} << 30;

std::mutex spare_mu;
int spare_descriptor = -1;  // guarded by spare_mu; opened on first use

}  // namespace

int RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return -1;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return OpenFileLimit();
}

int OpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return -1;
  return limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur > kMostDescriptors
             ? static_cast<int>(kMostDescriptors)
             : static_cast<int>(limit.rlim_cur);
}

const char* RefuseConnection(int fd, int open, int descriptor_limit, const ListenerLimits& limits) {
  if (fd >= descriptor_limit - limits.reserved_descriptors) return "descriptors";
  if (open >= limits.max_connections) return "max_connections";
  if (open >= ConnectionCap(descriptor_limit, limits)) return "descriptors";
  return nullptr;
}

int ConnectionCap(int descriptor_limit, const ListenerLimits& limits) {
  const int share =
      (descriptor_limit - limits.reserved_descriptors) / std::max(1, limits.descriptor_shares);
  return std::min(limits.max_connections, share);
}

void KeepSpareDescriptor() {
  std::lock_guard<std::mutex> lock(spare_mu);
  if (spare_descriptor < 0) spare_descriptor = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

bool DrainPendingConnection(int listen_fd, AcceptFn accept_fn) {
  std::lock_guard<std::mutex> lock(spare_mu);
  if (spare_descriptor < 0) return false;  // never kept, or lost to another thread's open
  close(spare_descriptor);
  const int drained = accept_fn(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (drained >= 0) close(drained);
  spare_descriptor = open("/dev/null", O_RDONLY | O_CLOEXEC);
  return drained >= 0;
}

}  // namespace kiln
