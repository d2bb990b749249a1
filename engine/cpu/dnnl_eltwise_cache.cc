#include "engine/cpu/dnnl_eltwise_cache.h"

#include <new>

#include "engine/cpu/dnnl_engine.h"

namespace kiln::cpu_internal {

namespace {

using dnnl::algorithm;
using dnnl::memory;

// The forward's algorithm and alpha; tanh and sigmoid take their backward from the output, as
// PyTorch does, the others from the input.
struct Algorithm {
  algorithm forward, backward;
  float alpha;
  bool backward_from_output;
};

Algorithm AlgorithmOf(ActivationKind kind) {
  switch (kind) {
    case ActivationKind::kTanh:
      return {algorithm::eltwise_tanh_use_dst_for_bwd, algorithm::eltwise_tanh_use_dst_for_bwd,
              0.0f, true};
    case ActivationKind::kSigmoid:
      return {algorithm::eltwise_logistic_use_dst_for_bwd,
              algorithm::eltwise_logistic_use_dst_for_bwd, 0.0f, true};
    case ActivationKind::kGelu:
      return {algorithm::eltwise_gelu_erf, algorithm::eltwise_gelu_erf, 0.0f, false};
    case ActivationKind::kSilu:  // swish with alpha 1: x * sigmoid(x)
      return {algorithm::eltwise_swish, algorithm::eltwise_swish, 1.0f, false};
    case ActivationKind::kLeakyRelu:
      break;
  }
  return {algorithm::undef, algorithm::undef, 0.0f, false};
}

}  // namespace

bool DnnlEltwiseCache::Handles(ActivationKind kind) {
  return AlgorithmOf(kind).forward != algorithm::undef;
}

absl::Status DnnlEltwiseCache::Forward(const dnnl::stream& stream, ActivationKind kind, int64_t n,
                                       const float* x, float* y) {
  if (n <= 0) return absl::OkStatus();
  const Algorithm a = AlgorithmOf(kind);
  if (a.forward == algorithm::undef) {
    return absl::InvalidArgumentError("activation forward: not a oneDNN eltwise kind");
  }
  const memory::desc md({n}, memory::data_type::f32, memory::format_tag::a);
  try {
    std::lock_guard<std::mutex> lock(mu_);
    const Key key{kind, n, Pass::kForward};
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      if (cache_.size() >= kMaxCachedShapes) cache_.clear();
      const dnnl::eltwise_forward::primitive_desc pd(
          dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, a.forward, md, a.alpha),
          DnnlEngine());
      it = cache_.emplace(key, dnnl::eltwise_forward(pd)).first;
    }
    const dnnl::engine& engine = DnnlEngine();
    it->second.execute(stream, {{DNNL_ARG_SRC, memory(md, engine, const_cast<float*>(x))},
                                {DNNL_ARG_DST, memory(md, engine, y)}});
  } catch (const dnnl::error& e) {
    return DnnlError("activation forward", e);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("activation forward: out of memory");
  }
  return absl::OkStatus();
}

absl::Status DnnlEltwiseCache::Backward(const dnnl::stream& stream, ActivationKind kind, int64_t n,
                                        const float* x, const float* y, const float* dy,
                                        float* dx) {
  if (n <= 0) return absl::OkStatus();
  const Algorithm a = AlgorithmOf(kind);
  if (a.backward == algorithm::undef) {
    return absl::InvalidArgumentError("activation backward: not a oneDNN eltwise kind");
  }
  const memory::desc md({n}, memory::data_type::f32, memory::format_tag::a);
  try {
    std::lock_guard<std::mutex> lock(mu_);
    const Key key{kind, n, Pass::kBackward};
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      if (cache_.size() >= kMaxCachedShapes) cache_.clear();
      const dnnl::eltwise_forward::primitive_desc hint(
          dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, a.forward, md, a.alpha),
          DnnlEngine());
      const dnnl::eltwise_backward::primitive_desc pd(
          dnnl::eltwise_backward::desc(a.backward, md, md, a.alpha), DnnlEngine(), hint);
      it = cache_.emplace(key, dnnl::eltwise_backward(pd)).first;
    }
    const dnnl::engine& engine = DnnlEngine();
    const float* data = a.backward_from_output ? y : x;
    it->second.execute(stream, {{a.backward_from_output ? DNNL_ARG_DST : DNNL_ARG_SRC,
                                 memory(md, engine, const_cast<float*>(data))},
                                {DNNL_ARG_DIFF_DST, memory(md, engine, const_cast<float*>(dy))},
                                {DNNL_ARG_DIFF_SRC, memory(md, engine, dx)}});
  } catch (const dnnl::error& e) {
    return DnnlError("activation backward", e);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("activation backward: out of memory");
  }
  return absl::OkStatus();
}

}  // namespace kiln::cpu_internal
