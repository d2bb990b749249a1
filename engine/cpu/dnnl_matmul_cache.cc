#include "engine/cpu/dnnl_matmul_cache.h"

#include <functional>
#include <new>

#include "engine/cpu/dnnl_engine.h"

namespace kiln::cpu_internal {

using dnnl::memory;

size_t DnnlMatmulCache::KeyHash::operator()(const Key& key) const {
  size_t h = std::hash<int>()(key.m);
  for (const size_t v :
       {std::hash<int>()(key.n), std::hash<int>()(key.k), std::hash<float>()(key.alpha),
        std::hash<float>()(key.beta), size_t{key.ta} * 2 + key.tb}) {
    h = h * 1000003u ^ v;
  }
  return h;
}

absl::Status DnnlMatmulCache::Run(const dnnl::stream& stream, Transpose ta, Transpose tb, int m,
                                  int n, int k, float alpha, const float* a, const float* b,
                                  float beta, float* c) {
  const Key key{ta == Transpose::kYes, tb == Transpose::kYes, m, n, k, alpha, beta};
  // A transposed operand is the same row-major storage read column-major ("ba").
  const memory::desc a_md({m, k}, memory::data_type::f32,
                          key.ta ? memory::format_tag::ba : memory::format_tag::ab);
  const memory::desc b_md({k, n}, memory::data_type::f32,
                          key.tb ? memory::format_tag::ba : memory::format_tag::ab);
  const memory::desc c_md({m, n}, memory::data_type::f32, memory::format_tag::ab);
  try {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      if (cache_.size() >= kMaxCachedShapes) cache_.clear();
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
      if (beta != 0.0f) {
        dnnl::post_ops ops;
        ops.append_sum(beta);
        attr.set_post_ops(ops);
      }
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, DnnlEngine());
      dnnl::matmul primitive(pd);
      it = cache_.emplace(key, Entry{std::move(pd), std::move(primitive)}).first;
    }
    const memory::desc scratch_md = it->second.pd.scratchpad_desc();
    if (scratchpad_.size() < scratch_md.get_size()) scratchpad_.resize(scratch_md.get_size());
    const dnnl::engine& engine = DnnlEngine();
    it->second.primitive.execute(
        stream, {{DNNL_ARG_SRC, memory(a_md, engine, const_cast<float*>(a))},
                 {DNNL_ARG_WEIGHTS, memory(b_md, engine, const_cast<float*>(b))},
                 {DNNL_ARG_DST, memory(c_md, engine, c)},
                 {DNNL_ARG_SCRATCHPAD, memory(scratch_md, engine, scratchpad_.data())}});
  } catch (const dnnl::error& e) {
    return DnnlError("gemm", e);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("gemm: out of memory for the oneDNN scratchpad");
  }
  return absl::OkStatus();
}

}  // namespace kiln::cpu_internal
