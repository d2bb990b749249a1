// The rendezvous store kilnd serves for a job's attempt (Workers.SetKey/GetKey) as the engine's
// KeyValueStore: what a worker on any node hands GlooCommunicator or NcclCommunicator to meet
// its peers.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/distributed/key_value_store.h"
#include "server/worker/coordinator_connection.h"

namespace kiln::worker {

// Thread-safe as the connection is. The connection must outlive the store.
class GrpcKeyValueStore final : public KeyValueStore {
 public:
  GrpcKeyValueStore(CoordinatorConnection* connection, std::string job_id)
      : connection_(connection), job_id_(std::move(job_id)) {}

  absl::Status Set(const std::string& key, const std::string& value) override;
  // kilnd waits at most 10 minutes per call; a longer timeout is served by several calls.
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;

 private:
  CoordinatorConnection* connection_;
  std::string job_id_;
};

}  // namespace kiln::worker
