// The rendezvous store: the only thing ranks share before they can talk to each other. Gloo's
// full mesh (each rank's address) and NCCL's unique id are bootstrapped through it, as PyTorch's
// c10d Store does. Implementations: a folder of files for processes on one machine
// (FileKeyValueStore); kilnd serves one over gRPC for workers on other nodes.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kiln {

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;

  // Publishes `value` under `key`, replacing any earlier value; readers see all of it or none.
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits up to `timeout` for `key` to be set, then returns its value. DeadlineExceeded naming
  // the key when it was not.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
  // Waits up to `timeout` until every key is set. DeadlineExceeded naming the missing keys.
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) = 0;
};

}  // namespace kiln
