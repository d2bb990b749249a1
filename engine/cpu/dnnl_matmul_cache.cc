#include "engine/cpu/dnnl_matmul_cache.h"

#include <functional>
#include <new>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/cpu/bf16.h"
#include "engine/cpu/dnnl_engine.h"

namespace kiln::cpu_internal {

using dnnl::memory;

size_t DnnlMatmulCache::KeyHash::operator()(const Key& key) const {
  size_t h = std::hash<int>()(key.m);
  for (const size_t v :
       {std::hash<int>()(key.n), std::hash<int>()(key.k), std::hash<float>()(key.alpha),
        std::hash<float>()(key.beta), size_t{key.ta} * 2 + key.tb, std::hash<int>()(key.batch),
        std::hash<int64_t>()(key.stride_a), std::hash<int64_t>()(key.stride_b),
        std::hash<int64_t>()(key.stride_c)}) {
    h = h * 1000003u ^ v;
  }
  return h;
}

absl::Status DnnlMatmulCache::Run(const dnnl::stream& stream, Transpose ta, Transpose tb, int m,
                                  int n, int k, float alpha, const float* a, const float* b,
                                  float beta, float* c) {
  const Key key{ta == Transpose::kYes, tb == Transpose::kYes, m, n, k, alpha, beta, 0, 0, 0, 0};
  // A transposed operand is the same row-major storage read column-major ("ba").
  const auto make = [&](memory::data_type in) {
    return Operands{memory::desc({m, k}, in, key.ta ? memory::format_tag::ba : memory::format_tag::ab),
                    memory::desc({k, n}, in, key.tb ? memory::format_tag::ba : memory::format_tag::ab),
                    memory::desc({m, n}, memory::data_type::f32, memory::format_tag::ab)};
  };
  return Execute(stream, key, make, a, b, c);
}

bool DnnlMatmulCache::Batchable(int m, int n, int k, int64_t stride_a, int64_t stride_b) {
  // Both 0 would broadcast a batch of 1 into every c, which oneDNN's matmul does not take.
  return (stride_a == 0 || stride_a >= int64_t{m} * k) &&
         (stride_b == 0 || stride_b >= int64_t{k} * n) && (stride_a != 0 || stride_b != 0);
}

absl::Status DnnlMatmulCache::RunBatched(const dnnl::stream& stream, Transpose ta, Transpose tb,
                                         int m, int n, int k, float alpha, const float* a,
                                         int64_t stride_a, const float* b, int64_t stride_b,
                                         float beta, float* c, int64_t stride_c, int batch) {
  const Key key{ta == Transpose::kYes,
                tb == Transpose::kYes,
                m,
                n,
                k,
                alpha,
                beta,
                batch,
                stride_a,
                stride_b,
                stride_c};
  // (batch, rows, cols) with explicit strides: a transposed operand's rows are 1 apart and its
  // columns a row length apart. A stride of 0 is a batch of 1 that oneDNN broadcasts (its
  // descriptors refuse a 0 stride on a longer axis); a lone matrix's batch stride is never read.
  auto operand = [](memory::data_type type, int64_t stride, int count, int rows, int cols,
                    bool transposed) {
    const int64_t size = int64_t{rows} * cols;
    const memory::dim outer = stride == 0 ? size : stride;
    return memory::desc({stride == 0 ? 1 : count, rows, cols}, type,
                        transposed ? memory::dims{outer, 1, rows} : memory::dims{outer, cols, 1});
  };
  const auto make = [&](memory::data_type in) {
    return Operands{operand(in, stride_a, batch, m, k, key.ta),
                    operand(in, stride_b, batch, k, n, key.tb),
                    operand(memory::data_type::f32, stride_c, batch, m, n, false)};
  };
  return Execute(stream, key, make, a, b, c);
}

DnnlMatmulCache::Entry DnnlMatmulCache::Create(const Key& key, const Operands& md,
                                               bool bf16) const {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (key.alpha != 1.0f) attr.set_output_scales(0, {key.alpha});
  if (key.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(key.beta);
    attr.set_post_ops(ops);
  }
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md.a, md.b, md.c), attr, DnnlEngine());
  dnnl::matmul primitive(pd);
  return Entry{std::move(pd), std::move(primitive), md, bf16};
}

absl::Status DnnlMatmulCache::Execute(const dnnl::stream& stream, const Key& key,
                                      const MakeOperands& make, const float* a, const float* b,
                                      float* c) {
  const char* what = key.batch > 0 ? "batched gemm" : "gemm";
  try {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      if (cache_.size() >= kMaxCachedShapes) cache_.clear();
      Entry entry = Create(key, make(bf16_ ? memory::data_type::bf16 : memory::data_type::f32),
                           bf16_);
      // oneDNN's reference kernels are slower than float32 by far: those shapes stay float32.
      if (bf16_ && std::string(entry.pd.impl_info_str()).rfind("ref", 0) == 0) {
        entry = Create(key, make(memory::data_type::f32), false);
        ++reference_fallbacks_;
      }
      it = cache_.emplace(key, std::move(entry)).first;
    }
    const Entry& entry = it->second;
    const void* a_in = a;
    const void* b_in = b;
    if (entry.bf16) {
      // The operands' extents (strides and gaps included) keep their layout in bfloat16.
      const int64_t a_elems = static_cast<int64_t>(entry.md.a.get_size() / sizeof(uint16_t));
      const int64_t b_elems = static_cast<int64_t>(entry.md.b.get_size() / sizeof(uint16_t));
      if (a16_.size() < static_cast<size_t>(a_elems)) a16_.resize(a_elems);
      if (b16_.size() < static_cast<size_t>(b_elems)) b16_.resize(b_elems);
      RoundToBf16(a_elems, a, a16_.data());
      RoundToBf16(b_elems, b, b16_.data());
      a_in = a16_.data();
      b_in = b16_.data();
    }
    const memory::desc scratch_md = entry.pd.scratchpad_desc();
    if (scratchpad_.size() < scratch_md.get_size()) scratchpad_.resize(scratch_md.get_size());
    const dnnl::engine& engine = DnnlEngine();
    entry.primitive.execute(
        stream, {{DNNL_ARG_SRC, memory(entry.md.a, engine, const_cast<void*>(a_in))},
                 {DNNL_ARG_WEIGHTS, memory(entry.md.b, engine, const_cast<void*>(b_in))},
                 {DNNL_ARG_DST, memory(entry.md.c, engine, c)},
                 {DNNL_ARG_SCRATCHPAD, memory(scratch_md, engine, scratchpad_.data())}});
  } catch (const dnnl::error& e) {
    return DnnlError(what, e);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": out of memory for the oneDNN scratchpad or the bfloat16 operands"));
  }
  return absl::OkStatus();
}

}  // namespace kiln::cpu_internal
