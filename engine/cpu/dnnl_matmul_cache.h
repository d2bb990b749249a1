// GEMMs as oneDNN matmul primitives, created once per shape and kept. Internal to engine/cpu/.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace kiln::cpu_internal {

class DnnlMatmulCache {
 public:
  // bf16: bfloat16 products (Precision::kBf16): A and B are rounded to bfloat16 (bf16.h) before
  // each product, which accumulates in float32 into C. A shape whose bfloat16 primitive would be
  // one of oneDNN's reference kernels (no AVX512_BF16 for it) stays float32;
  // reference_fallbacks() counts those shapes.
  explicit DnnlMatmulCache(bool bf16) : bf16_(bf16) {}
  int reference_fallbacks() const { return reference_fallbacks_; }

  // C(m,n) = alpha * op(A) * op(B) + beta * C, Backend::Gemm's contract. Runs on the calling
  // thread's OpenMP team.
  absl::Status Run(const dnnl::stream& stream, Transpose ta, Transpose tb, int m, int n, int k,
                   float alpha, const float* a, const float* b, float beta, float* c);
  // `batch` of them in one 3-D primitive, the i-th on a + i * stride_a, b + i * stride_b and
  // c + i * stride_c (Backend::GemmStridedBatched), batch > 1. A stride of 0 repeats its matrix
  // (oneDNN's broadcast); the strides must pass Batchable (oneDNN refuses overlapping layouts),
  // stride_c be at least m * n.
  absl::Status RunBatched(const dnnl::stream& stream, Transpose ta, Transpose tb, int m, int n,
                          int k, float alpha, const float* a, int64_t stride_a, const float* b,
                          int64_t stride_b, float beta, float* c, int64_t stride_c, int batch);
  // Whether RunBatched takes these strides: each 0 or no less than its matrix's size, not both 0.
  static bool Batchable(int m, int n, int k, int64_t stride_a, int64_t stride_b);

 private:
  struct Key {
    bool ta, tb;
    int m, n, k;
    float alpha, beta;
    int batch;  // 0 for Run's 2-D primitive
    int64_t stride_a, stride_b, stride_c;
    bool operator==(const Key& o) const {
      return ta == o.ta && tb == o.tb && m == o.m && n == o.n && k == o.k && alpha == o.alpha &&
             beta == o.beta && batch == o.batch && stride_a == o.stride_a &&
             stride_b == o.stride_b && stride_c == o.stride_c;
    }
  };
  struct KeyHash {
    size_t operator()(const Key& key) const;
  };
  // The descriptors of A, B and C for A and B of the given data type (C is always float32).
  struct Operands {
    dnnl::memory::desc a, b, c;
  };
  using MakeOperands = std::function<Operands(dnnl::memory::data_type)>;
  struct Entry {
    dnnl::matmul::primitive_desc pd;
    dnnl::matmul primitive;
    Operands md;
    bool bf16;  // A and B are rounded to bfloat16 for it
  };

  // Runs the primitive of `key` (made from make's descriptors the first time) on a, b and c.
  absl::Status Execute(const dnnl::stream& stream, const Key& key, const MakeOperands& make,
                       const float* a, const float* b, float* c);
  // The primitive for `key` on these operands.
  Entry Create(const Key& key, const Operands& md, bool bf16) const;

  std::mutex mu_;  // guards the map; a backend's ops run one at a time
  std::unordered_map<Key, Entry, KeyHash> cache_;
  std::vector<char> scratchpad_;  // shared by every shape, grown to the largest
  const bool bf16_;
  int reference_fallbacks_ = 0;
  std::vector<uint16_t> a16_, b16_;  // A and B rounded to bfloat16, grown to the largest
};

}  // namespace kiln::cpu_internal
