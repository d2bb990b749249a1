// Gives Gloo's rendezvous (gloo::rendezvous::Context::connectFullMesh) a kiln KeyValueStore.
// Gloo reports errors by exceptions: a failed or timed-out store call throws gloo::IoException
// with the store's message, which GlooCommunicator turns back into a Status.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "engine/distributed/key_value_store.h"
#include "gloo/rendezvous/store.h"

namespace kiln {

class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  // `store` must outlive the adapter; `timeout` bounds get() and wait() without a timeout of
  // their own.
  GlooStoreAdapter(KeyValueStore* store, absl::Duration timeout)
      : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  KeyValueStore* store_;
  absl::Duration timeout_;
};

}  // namespace kiln
