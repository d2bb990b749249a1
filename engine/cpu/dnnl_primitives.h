// What the CPU backend keeps of oneDNN: a stream, the GEMMs, the activations and the convolution
// plans by shape.
// Internal to engine/cpu/; CpuBackend holds one behind a pointer so that its header stays free
// of oneDNN's.
#pragma once

#include <memory>
#include <mutex>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/cpu/dnnl_conv_plan.h"
#include "engine/cpu/dnnl_eltwise_cache.h"
#include "engine/cpu/dnnl_matmul_cache.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace kiln::cpu_internal {

// A convolution's shape as its plans are keyed.
struct ConvKey {
  Conv2dGeometry g;
  bool bias = false;
  Activation act = Activation::kNone;
  bool operator==(const ConvKey& o) const;
};
struct ConvKeyHash {
  size_t operator()(const ConvKey& key) const;
};

class DnnlPrimitives {
 public:
  // bf16: bfloat16 GEMMs and convolutions (Precision::kBf16; see DnnlMatmulCache and
  // ConvForwardPlan).
  explicit DnnlPrimitives(bool bf16);

  const dnnl::stream& stream() const { return stream_; }
  bool bf16() const { return bf16_; }
  DnnlMatmulCache& matmuls() { return matmuls_; }
  DnnlEltwiseCache& eltwise() { return eltwise_; }
  // The plan for `key`, created on first use (on the calling thread's team size) and kept.
  absl::StatusOr<const ConvForwardPlan*> Forward(const ConvKey& key);
  absl::StatusOr<const ConvBackwardPlan*> Backward(const ConvKey& key);

 private:
  dnnl::stream stream_;
  DnnlMatmulCache matmuls_;
  DnnlEltwiseCache eltwise_;
  const bool bf16_;
  std::mutex mu_;  // guards the maps; plans, once made, are never changed
  std::unordered_map<ConvKey, std::unique_ptr<ConvForwardPlan>, ConvKeyHash> forward_;
  std::unordered_map<ConvKey, std::unique_ptr<ConvBackwardPlan>, ConvKeyHash> backward_;
};

}  // namespace kiln::cpu_internal
