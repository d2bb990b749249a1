// A Communicator on Gloo's TCP transport, for ranks that train on CPUs (host memory). Ranks meet
// through a KeyValueStore (Gloo's full mesh: each rank publishes its address and connects to
// every other); every operation has a timeout, so a dead peer ends in an error, not a hang.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/distributed/communicator.h"
#include "engine/distributed/key_value_store.h"

namespace gloo {
class Context;
}

namespace kiln {

struct GlooOptions {
  // The address this rank listens on and publishes: a host name or IP ("127.0.0.1" for ranks
  // on one machine), or, when `interface` is set, that network interface's address ("eth0").
  std::string hostname = "127.0.0.1";
  std::string interface;
  // Bounds the rendezvous and every collective: a peer that has not answered by then is taken
  // for dead.
  absl::Duration timeout = absl::Seconds(30);
};

class GlooCommunicator final : public Communicator {
 public:
  // Joins rank `rank` of `size` through `store` (used only during Create). Blocks until every
  // rank has joined or the timeout passes (DeadlineExceeded/Unavailable naming this rank).
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(KeyValueStore* store, int rank,
                                                                  int size,
                                                                  const GlooOptions& options = {});
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  DeviceKind device() const override { return DeviceKind::kCpu; }
  absl::Status AllreduceSum(float* data, size_t count) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status Barrier() override;

 private:
  GlooCommunicator(int rank, int size, absl::Duration timeout)
      : rank_(rank), size_(size), timeout_(timeout) {}
  // Runs `op` (a Gloo call), turning Gloo's exceptions into Unavailable naming `what` and this
  // rank; after a failure every call returns the first error.
  template <typename Op>
  absl::Status Guarded(const char* what, Op op);

  int rank_, size_;
  absl::Duration timeout_;
  std::shared_ptr<gloo::Context> context_;
  absl::Status failed_;
};

}  // namespace kiln
