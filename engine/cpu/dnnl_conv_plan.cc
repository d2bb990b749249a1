#include "engine/cpu/dnnl_conv_plan.h"

#include <algorithm>
#include <new>
#include <string>
#include <unordered_map>

#include "engine/cpu/bf16.h"
#include "engine/cpu/cpu_parallel.h"
#include "engine/cpu/dnnl_engine.h"

namespace kiln::cpu_internal {
namespace {

using dnnl::algorithm;
using dnnl::memory;
using Tag = dnnl::memory::format_tag;

constexpr auto kF32 = memory::data_type::f32;
constexpr auto kBf16 = memory::data_type::bf16;

// Lays out a workspace: slots 64-byte aligned, one after another, and one scratchpad that every
// primitive of the plan shares (they run one after another).
class WorkspaceLayout {
 public:
  size_t Add(size_t bytes) {
    const size_t at = end_;
    end_ += (bytes + 63) / 64 * 64;
    return at;
  }
  void NeedScratchpad(const memory::desc& md) {
    if (md.get_size() > scratchpad_.get_size()) scratchpad_ = md;
  }
  // Places the scratchpad; returns the workspace's size.
  size_t Finish(size_t* scratchpad_offset, memory::desc* scratchpad_md) {
    *scratchpad_offset = Add(scratchpad_.get_size());
    *scratchpad_md = scratchpad_;
    return end_;
  }

 private:
  size_t end_ = 0;
  memory::desc scratchpad_;  // zero bytes until a primitive asks for one
};

dnnl::primitive_attr UserScratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// Stages `plain` into (or, for an output, out of) `staged`. `accumulate`: the output reorder adds
// into the plain tensor (a sum post-op) instead of overwriting it, and always runs.
Staging Stage(const memory::desc& plain, const memory::desc& staged, bool input, bool accumulate,
              WorkspaceLayout* layout) {
  Staging s;
  s.plain = plain;
  s.staged = staged;
  s.needed = accumulate || plain != staged;
  if (!s.needed) return s;
  dnnl::primitive_attr attr = UserScratchpad();
  if (accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  const dnnl::engine& engine = DnnlEngine();
  const dnnl::reorder::primitive_desc pd =
      input ? dnnl::reorder::primitive_desc(engine, plain, engine, staged, attr)
            : dnnl::reorder::primitive_desc(engine, staged, engine, plain, attr);
  layout->NeedScratchpad(pd.scratchpad_desc());
  s.reorder = dnnl::reorder(pd);
  s.offset = layout->Add(staged.get_size());
  return s;
}

memory Wrap(const memory::desc& md, const void* p) {
  return memory(md, DnnlEngine(), const_cast<void*>(p));
}

// The staged copy of a plain input: reordered into the workspace, or the input itself.
memory StageIn(const dnnl::stream& stream, const Staging& s, const void* plain, char* workspace,
               const memory& scratchpad) {
  if (!s.needed) return Wrap(s.plain, plain);
  memory staged = Wrap(s.staged, workspace + s.offset);
  s.reorder.execute(stream, {{DNNL_ARG_FROM, Wrap(s.plain, plain)},
                             {DNNL_ARG_TO, staged},
                             {DNNL_ARG_SCRATCHPAD, scratchpad}});
  return staged;
}

// Where a primitive writes an output: the workspace slot when it is staged, else `plain`.
memory OutputOf(const Staging& s, void* plain, char* workspace) {
  return s.needed ? Wrap(s.staged, workspace + s.offset) : Wrap(s.plain, plain);
}

void StageOut(const dnnl::stream& stream, const Staging& s, void* plain, char* workspace,
              const memory& scratchpad) {
  if (!s.needed) return;
  s.reorder.execute(stream, {{DNNL_ARG_FROM, Wrap(s.staged, workspace + s.offset)},
                             {DNNL_ARG_TO, Wrap(s.plain, plain)},
                             {DNNL_ARG_SCRATCHPAD, scratchpad}});
}

// The plain tensors, and the "any" descriptors a primitive picks its layouts for: under bf16 the
// operands a product reads (x, w, dy) are bfloat16 and the ones it writes (y, dw, dx) float32.
struct ConvDescs {
  memory::desc src, weights, dst, bias;
  memory::desc src_any, weights_any, dst_any;              // read: x, w (forward and dx), dy
  memory::desc out_dst_any, out_weights_any, out_src_any;  // written: y, dw, dx
  memory::dims strides, padding;
};

ConvDescs DescsOf(const Conv2dGeometry& g, bool bias, bool bf16) {
  const memory::data_type read = bf16 ? kBf16 : kF32;
  ConvDescs d;
  const memory::dims src = {g.batch, g.in_channels, g.in_h, g.in_w};
  const memory::dims weights = {g.out_channels, g.in_channels, g.kernel_h, g.kernel_w};
  const memory::dims dst = {g.batch, g.out_channels, g.out_h(), g.out_w()};
  // The caller's x and y (and so dx and dy) in the layouts it keeps them in: where those are the
  // primitive's, no reorder runs.
  auto tag = [](ImageLayout l) { return l == ImageLayout::kNchw16c ? Tag::nChw16c : Tag::nchw; };
  d.src = memory::desc(src, kF32, tag(g.x_layout));
  d.weights = memory::desc(weights, kF32, Tag::oihw);
  d.dst = memory::desc(dst, kF32, tag(g.y_layout));
  if (bias) d.bias = memory::desc({g.out_channels}, kF32, Tag::x);
  d.src_any = memory::desc(src, read, Tag::any);
  d.weights_any = memory::desc(weights, read, Tag::any);
  d.dst_any = memory::desc(dst, read, Tag::any);
  d.out_dst_any = memory::desc(dst, kF32, Tag::any);
  d.out_weights_any = memory::desc(weights, kF32, Tag::any);
  d.out_src_any = memory::desc(src, kF32, Tag::any);
  d.strides = {g.stride_h, g.stride_w};
  d.padding = {g.padding_h, g.padding_w};
  return d;
}

// Winograd's F(4x4, 3x3) (oneDNN's jit_wino_4x3, float32 only) where it beats the direct kernel:
// 3x3, stride 1, channels in blocks of 16, 32 and more of them for the forward and the data
// gradient, 64 and more for the weight gradient. Measured on this CPU (2 threads, batch 128, ms
// direct -> Winograd): 32 channels at 16x16 forward 1.24 -> 0.87, data 1.22 -> 0.84, weights 1.27
// -> 1.31 (no gain: direct kept); 64 at 8x8 1.28 -> 0.61, 1.20 -> 0.60, 1.28 -> 0.91; 128 at
// 8x8 4.9 -> 2.6 on every pass; 16 channels at 32x32 are slower in Winograd (1.57 -> 3.0). Its
// sums run in another order than the direct kernel's: the same bound against the definition.
struct Algorithms {
  algorithm forward = algorithm::convolution_direct;
  algorithm backward_data = algorithm::convolution_direct;
  algorithm backward_weights = algorithm::convolution_direct;
};

Algorithms AlgorithmsFor(const Conv2dGeometry& g, bool bf16) {
  Algorithms a;
  const int channels = std::min(g.in_channels, g.out_channels);
  if (bf16 || g.kernel_h != 3 || g.kernel_w != 3 || g.stride_h != 1 || g.stride_w != 1 ||
      g.in_channels % 16 != 0 || g.out_channels % 16 != 0 || channels < 32) {
    return a;
  }
  a.forward = a.backward_data = algorithm::convolution_winograd;
  if (channels >= 64) a.backward_weights = algorithm::convolution_winograd;
  return a;
}

// Builds the primitive descriptor `make(alg)` with Winograd where asked and oneDNN has it for the
// geometry (it has not, for example, for some paddings), else the direct one.
template <typename MakePd>
auto WinogradOrDirect(algorithm alg, const MakePd& make) -> decltype(make(alg)) {
  if (alg == algorithm::convolution_winograd) {
    try {
      return make(alg);
    } catch (const dnnl::error&) {
      // No Winograd kernel for this geometry: the direct one below.
    }
  }
  return make(algorithm::convolution_direct);
}

dnnl::convolution_forward::primitive_desc ForwardPd(const ConvDescs& d, Activation act,
                                                    algorithm alg) {
  dnnl::primitive_attr attr = UserScratchpad();
  if (act == Activation::kRelu) {
    dnnl::post_ops ops;
    ops.append_eltwise(1.0f, algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(ops);
  }
  // forward_training: the backward primitives take its descriptor as their hint.
  return WinogradOrDirect(alg, [&](algorithm a) {
    return dnnl::convolution_forward::primitive_desc(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, a, d.src_any,
                                        d.weights_any, d.bias, d.out_dst_any, d.strides, d.padding,
                                        d.padding),
        attr, DnnlEngine());
  });
}

// Whether a primitive runs Winograd's kernel ("jit_wino_4x3:...").
bool IsWinograd(const dnnl::primitive_desc_base& pd) {
  return std::string(pd.impl_info_str()).find("wino") != std::string::npos;
}

// The bfloat16 plan where asked for and oneDNN has more than its reference kernel for it, else
// the float32 one (which reports a geometry no plan can run).
template <typename Plan, typename BuildFn>
absl::StatusOr<std::unique_ptr<Plan>> PreferBf16(bool bf16, const BuildFn& build) {
  if (bf16) {
    absl::StatusOr<std::unique_ptr<Plan>> plan = build(true);
    if (plan.ok() && !(*plan)->reference_kernel()) return plan;
  }
  return build(false);
}

// Whether a primitive is oneDNN's reference implementation ("ref:any"): plain loops, no JIT.
bool IsReference(const dnnl::primitive_desc_base& pd) {
  return std::string(pd.impl_info_str()).rfind("ref", 0) == 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ConvForwardPlan>> ConvForwardPlan::Create(const Conv2dGeometry& g,
                                                                         bool bias, Activation act,
                                                                         bool bf16) {
  return PreferBf16<ConvForwardPlan>(bf16, [&](bool b) { return Build(g, bias, act, b); });
}

absl::StatusOr<std::unique_ptr<ConvForwardPlan>> ConvForwardPlan::Build(const Conv2dGeometry& g,
                                                                        bool bias, Activation act,
                                                                        bool bf16) {
  try {
    const ConvDescs d = DescsOf(g, bias, bf16);
    const auto pd = ForwardPd(d, act, AlgorithmsFor(g, bf16).forward);
    auto plan = std::unique_ptr<ConvForwardPlan>(new ConvForwardPlan());
    plan->reference_kernel_ = IsReference(pd);
    plan->winograd_ = IsWinograd(pd);
    plan->bf16_ = bf16;
    plan->dst_blocked16_ =
        g.out_channels % 16 == 0 && pd.dst_desc() == memory::desc(d.dst.dims(), kF32, Tag::nChw16c);
    WorkspaceLayout layout;
    layout.NeedScratchpad(pd.scratchpad_desc());
    plan->bias_md_ = d.bias;
    plan->src_ = Stage(d.src, pd.src_desc(), /*input=*/true, false, &layout);
    plan->weights_ = Stage(d.weights, pd.weights_desc(), /*input=*/true, false, &layout);
    plan->dst_ = Stage(d.dst, pd.dst_desc(), /*input=*/false, false, &layout);
    plan->workspace_bytes_ = layout.Finish(&plan->scratchpad_offset_, &plan->scratchpad_md_);
    plan->conv_ = dnnl::convolution_forward(pd);
    return plan;
  } catch (const dnnl::error& e) {
    return DnnlError("conv2d forward", e);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("conv2d forward: out of memory creating the primitive");
  }
}

absl::Status ConvForwardPlan::Run(const dnnl::stream& stream, const float* x, const float* w,
                                  const float* bias, float* y, char* workspace) const {
  return Execute(stream, x, w, bias, y, /*keep_blocked=*/false, workspace);
}

absl::Status ConvForwardPlan::RunToBlocked16(const dnnl::stream& stream, const float* x,
                                             const float* w, const float* bias, float* y,
                                             char* workspace) const {
  if (!dst_blocked16_) {
    return absl::FailedPreconditionError("conv2d forward: the output is not in nChw16c");
  }
  return Execute(stream, x, w, bias, y, /*keep_blocked=*/true, workspace);
}

absl::Status ConvForwardPlan::Execute(const dnnl::stream& stream, const float* x, const float* w,
                                      const float* bias, float* y, bool keep_blocked,
                                      char* workspace) const {
  try {
    const memory scratchpad = Wrap(scratchpad_md_, workspace + scratchpad_offset_);
    std::unordered_map<int, memory> args = {
        {DNNL_ARG_SRC, StageIn(stream, src_, x, workspace, scratchpad)},
        {DNNL_ARG_WEIGHTS, StageIn(stream, weights_, w, workspace, scratchpad)},
        {DNNL_ARG_DST, keep_blocked ? Wrap(dst_.staged, y) : OutputOf(dst_, y, workspace)},
        {DNNL_ARG_SCRATCHPAD, scratchpad}};
    if (bias != nullptr) args.emplace(DNNL_ARG_BIAS, Wrap(bias_md_, bias));
    conv_.execute(stream, args);
    if (!keep_blocked) StageOut(stream, dst_, y, workspace, scratchpad);
  } catch (const dnnl::error& e) {
    return DnnlError("conv2d forward", e);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ConvBackwardPlan>> ConvBackwardPlan::Create(const Conv2dGeometry& g,
                                                                           bool bias,
                                                                           Activation act,
                                                                           bool bf16) {
  return PreferBf16<ConvBackwardPlan>(bf16, [&](bool b) { return Build(g, bias, act, b); });
}

absl::StatusOr<std::unique_ptr<ConvBackwardPlan>> ConvBackwardPlan::Build(const Conv2dGeometry& g,
                                                                          bool bias, Activation act,
                                                                          bool bf16) {
  try {
    const ConvDescs d = DescsOf(g, bias, bf16);
    const Algorithms algorithms = AlgorithmsFor(g, bf16);
    const auto hint = ForwardPd(d, act, algorithms.forward);
    const dnnl::primitive_attr attr = UserScratchpad();
    const dnnl::engine& engine = DnnlEngine();
    const auto weights_pd = WinogradOrDirect(algorithms.backward_weights, [&](algorithm a) {
      return dnnl::convolution_backward_weights::primitive_desc(
          dnnl::convolution_backward_weights::desc(a, d.src_any, d.out_weights_any, d.bias,
                                                   d.dst_any, d.strides, d.padding, d.padding),
          attr, engine, hint);
    });
    const auto data_pd = WinogradOrDirect(algorithms.backward_data, [&](algorithm a) {
      return dnnl::convolution_backward_data::primitive_desc(
          dnnl::convolution_backward_data::desc(a, d.out_src_any, d.weights_any, d.dst_any,
                                                d.strides, d.padding, d.padding),
          attr, engine, hint);
    });
    auto plan = std::unique_ptr<ConvBackwardPlan>(new ConvBackwardPlan());
    plan->reference_kernel_ = IsReference(weights_pd) || IsReference(data_pd);
    plan->winograd_data_ = IsWinograd(data_pd);
    plan->winograd_weights_ = IsWinograd(weights_pd);
    plan->bf16_ = bf16;
    plan->act_ = act;
    plan->out_elems_ = static_cast<int64_t>(d.dst.get_size() / sizeof(float));
    plan->out_channels_ = g.out_channels;
    plan->bias_md_ = d.bias;
    WorkspaceLayout layout;
    layout.NeedScratchpad(weights_pd.scratchpad_desc());
    layout.NeedScratchpad(data_pd.scratchpad_desc());
    plan->diff_dst_shared_ = data_pd.diff_dst_desc() == weights_pd.diff_dst_desc();
    // Where both primitives take dy in channel blocks of 16, the ReLU's mask is applied while
    // blocking it, in one pass instead of a masking pass and a reorder.
    plan->diff_dst_blocked16_ =
        plan->diff_dst_shared_ && g.out_channels % 16 == 0 &&
        weights_pd.diff_dst_desc() == memory::desc(d.dst.dims(), bf16 ? kBf16 : kF32, Tag::nChw16c);
    // (MaskIntoBlocks reads y and dy in NCHW.)
    plan->mask_into_blocks_ =
        act == Activation::kRelu && plan->diff_dst_blocked16_ && g.y_layout == ImageLayout::kNchw;
    if (act == Activation::kRelu && !plan->mask_into_blocks_) {
      plan->masked_offset_ = layout.Add(d.dst.get_size());
    }
    if (bias) plan->dbias_offset_ = layout.Add(d.bias.get_size());
    plan->src_w_ = Stage(d.src, weights_pd.src_desc(), /*input=*/true, false, &layout);
    plan->diff_dst_w_ = Stage(d.dst, weights_pd.diff_dst_desc(), /*input=*/true, false, &layout);
    plan->out_hw_ = int64_t{g.out_h()} * g.out_w();
    // Always through the workspace: oneDNN overwrites, the contract accumulates.
    plan->diff_weights_ =
        Stage(d.weights, weights_pd.diff_weights_desc(), /*input=*/false, true, &layout);
    if (!plan->diff_dst_shared_) {
      plan->diff_dst_d_ = Stage(d.dst, data_pd.diff_dst_desc(), /*input=*/true, false, &layout);
    }
    plan->weights_d_ = Stage(d.weights, data_pd.weights_desc(), /*input=*/true, false, &layout);
    plan->diff_src_ = Stage(d.src, data_pd.diff_src_desc(), /*input=*/false, false, &layout);
    plan->workspace_bytes_ = layout.Finish(&plan->scratchpad_offset_, &plan->scratchpad_md_);
    plan->backward_weights_ = dnnl::convolution_backward_weights(weights_pd);
    plan->backward_data_ = dnnl::convolution_backward_data(data_pd);
    return plan;
  } catch (const dnnl::error& e) {
    return DnnlError("conv2d backward", e);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("conv2d backward: out of memory creating the primitive");
  }
}

namespace {

// ConvBackwardPlan::MaskIntoBlocks into float32 or bfloat16 blocks.
template <typename T>
void MaskIntoBlocksOf(int64_t out_elems, int64_t hw, const float* y, const float* dy, T* blocked) {
  const int64_t blocks = out_elems / (16 * hw);
#pragma omp parallel for schedule(static) if (out_elems > kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    // Block b is 16 consecutive NCHW planes, interleaved: blocked[p * 16 + c] = plane c at p.
    const float* yb = y + b * 16 * hw;
    const float* db = dy + b * 16 * hw;
    T* out = blocked + b * 16 * hw;
    for (int c = 0; c < 16; ++c) {
      const float* yc = yb + c * hw;
      const float* dc = db + c * hw;
      for (int64_t p = 0; p < hw; ++p)
        out[p * 16 + c] = AsElement(yc[p] > 0.0f ? dc[p] : 0.0f, out);
    }
  }
}

}  // namespace

void ConvBackwardPlan::MaskIntoBlocks(const float* y, const float* dy, void* blocked) const {
  if (bf16_) {
    MaskIntoBlocksOf(out_elems_, out_hw_, y, dy, static_cast<uint16_t*>(blocked));
  } else {
    MaskIntoBlocksOf(out_elems_, out_hw_, y, dy, static_cast<float*>(blocked));
  }
}

absl::Status ConvBackwardPlan::Run(const dnnl::stream& stream, const float* x, const float* w,
                                   const float* y, const float* dy, float* dw, float* dbias,
                                   float* dx, char* workspace) const {
  if (mask_into_blocks_) {
    MaskIntoBlocks(y, dy, workspace + diff_dst_w_.offset);
  } else if (act_ == Activation::kRelu) {
    // The fused ReLU's backward: pass the gradient where the output was positive.
    float* masked = reinterpret_cast<float*>(workspace + masked_offset_);
    const int64_t n = out_elems_;
#pragma omp parallel for simd if (n > kParallelMin) schedule(static)
    for (int64_t i = 0; i < n; ++i) masked[i] = y[i] > 0.0f ? dy[i] : 0.0f;
    dy = masked;
  }
  try {
    const memory scratchpad = Wrap(scratchpad_md_, workspace + scratchpad_offset_);
    const memory diff_dst_w = mask_into_blocks_
                                  ? Wrap(diff_dst_w_.staged, workspace + diff_dst_w_.offset)
                                  : StageIn(stream, diff_dst_w_, dy, workspace, scratchpad);
    return Execute(stream, x, w, diff_dst_w, dy, dw, dbias, dx, workspace, scratchpad);
  } catch (const dnnl::error& e) {
    return DnnlError("conv2d backward", e);
  }
}

absl::Status ConvBackwardPlan::RunFromBlockedDiffDst(const dnnl::stream& stream, const float* x,
                                                     const float* w, float* dw, float* dbias,
                                                     float* dx, char* workspace) const {
  if (!diff_dst_blocked16_) {
    return absl::FailedPreconditionError("conv2d backward: dy is not taken in nChw16c");
  }
  try {
    const memory scratchpad = Wrap(scratchpad_md_, workspace + scratchpad_offset_);
    const memory diff_dst_w = Wrap(diff_dst_w_.staged, workspace + diff_dst_w_.offset);
    return Execute(stream, x, w, diff_dst_w, /*dy=*/nullptr, dw, dbias, dx, workspace, scratchpad);
  } catch (const dnnl::error& e) {
    return DnnlError("conv2d backward", e);
  }
}

absl::Status ConvBackwardPlan::Execute(const dnnl::stream& stream, const float* x, const float* w,
                                       const memory& diff_dst_w, const float* dy, float* dw,
                                       float* dbias, float* dx, char* workspace,
                                       const memory& scratchpad) const {
  try {
    std::unordered_map<int, memory> args = {
        {DNNL_ARG_SRC, StageIn(stream, src_w_, x, workspace, scratchpad)},
        {DNNL_ARG_DIFF_DST, diff_dst_w},
        {DNNL_ARG_DIFF_WEIGHTS, OutputOf(diff_weights_, dw, workspace)},
        {DNNL_ARG_SCRATCHPAD, scratchpad}};
    float* dbias_tmp = reinterpret_cast<float*>(workspace + dbias_offset_);
    if (bias_md_.get_size() > 0) args.emplace(DNNL_ARG_DIFF_BIAS, Wrap(bias_md_, dbias_tmp));
    backward_weights_.execute(stream, args);
    StageOut(stream, diff_weights_, dw, workspace, scratchpad);
    if (dbias != nullptr && bias_md_.get_size() > 0) {
      for (int oc = 0; oc < out_channels_; ++oc) dbias[oc] += dbias_tmp[oc];
    }
    if (dx != nullptr) {
      const memory diff_dst_d =
          diff_dst_shared_ ? diff_dst_w : StageIn(stream, diff_dst_d_, dy, workspace, scratchpad);
      backward_data_.execute(
          stream, {{DNNL_ARG_DIFF_DST, diff_dst_d},
                   {DNNL_ARG_WEIGHTS, StageIn(stream, weights_d_, w, workspace, scratchpad)},
                   {DNNL_ARG_DIFF_SRC, OutputOf(diff_src_, dx, workspace)},
                   {DNNL_ARG_SCRATCHPAD, scratchpad}});
      StageOut(stream, diff_src_, dx, workspace, scratchpad);
    }
  } catch (const dnnl::error& e) {
    return DnnlError("conv2d backward", e);
  }
  return absl::OkStatus();
}

}  // namespace kiln::cpu_internal
