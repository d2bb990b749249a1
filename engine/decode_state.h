// One generation stream's state for incremental decoding (Model::ForwardAt): the positions of its
// sequence run so far, each causal attention layer's keys and values for them (KvCache), and the
// activations of the last call. Made by Model::NewDecodeState; used by one thread at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/tensor.h"

namespace kiln {

class Model;

class DecodeState {
 public:
  // Positions run so far: where the next ForwardAt's new positions start.
  int64_t length() const { return length_; }
  // The most positions it holds: the model's sequence length T.
  int64_t capacity() const { return capacity_; }
  // Forgets every position (length 0), keeping the memory: the next ForwardAt is a prefill.
  void Reset() {
    length_ = 0;
    for (KvCache& c : caches_) c.length = 0;
  }

 private:
  friend class Model;
  DecodeState() = default;

  const Model* model_ = nullptr;  // the model it was made for
  int64_t capacity_ = 0, length_ = 0;
  std::vector<KvCache> caches_;      // per layer; only causal attention layers fill theirs
  std::vector<Tensor> activations_;  // per value as Model's: [i + 1] layer i's, (1, T, ...)
};

}  // namespace kiln
