// The one place that picks a rank's Communicator from the backend it trains on: NCCL over a CUDA
// backend's device memory and stream, Gloo over TCP for the CPU (communicator.h).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/backend.h"
#include "engine/distributed/communicator.h"
#include "engine/distributed/key_value_store.h"

namespace kiln {

struct CommunicatorOptions {
  // Bounds the rendezvous and every collective: a peer that has not answered by then is taken
  // for dead.
  absl::Duration timeout = absl::Seconds(60);
  // Gloo only (GlooOptions): the address this rank listens on and publishes, a host name or IP,
  // or, when `gloo_interface` is set, that network interface's address ("eth0").
  std::string gloo_hostname = "127.0.0.1";
  std::string gloo_interface;
};

// Joins rank `rank` of `world_size` through `store` (used only during the call) with the
// communicator for `backend` (which must outlive it): NcclCommunicator for a CUDA backend,
// GlooCommunicator otherwise. Blocks until every rank has joined or the timeout passes.
// FailedPrecondition for a CUDA backend in a build without NCCL; the communicators' own errors
// otherwise.
absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    Backend* backend, KeyValueStore* store, int rank, int world_size,
    const CommunicatorOptions& options = {});

}  // namespace kiln
