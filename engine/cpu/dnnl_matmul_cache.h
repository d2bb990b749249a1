// GEMMs as oneDNN matmul primitives, created once per shape and kept. Internal to engine/cpu/.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace kiln::cpu_internal {

class DnnlMatmulCache {
 public:
  // C(m,n) = alpha * op(A) * op(B) + beta * C, Backend::Gemm's contract. Runs on the calling
  // thread's OpenMP team.
  absl::Status Run(const dnnl::stream& stream, Transpose ta, Transpose tb, int m, int n, int k,
                   float alpha, const float* a, const float* b, float beta, float* c);

 private:
  struct Key {
    bool ta, tb;
    int m, n, k;
    float alpha, beta;
    bool operator==(const Key& o) const {
      return ta == o.ta && tb == o.tb && m == o.m && n == o.n && k == o.k && alpha == o.alpha &&
             beta == o.beta;
    }
  };
  struct KeyHash {
    size_t operator()(const Key& key) const;
  };
  struct Entry {
    dnnl::matmul::primitive_desc pd;
    dnnl::matmul primitive;
  };

  std::mutex mu_;  // guards the map; a backend's ops run one at a time
  std::unordered_map<Key, Entry, KeyHash> cache_;
  std::vector<char> scratchpad_;  // shared by every shape, grown to the largest
};

}  // namespace kiln::cpu_internal
