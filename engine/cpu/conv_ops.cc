// CpuBackend's convolutions: oneDNN convolution primitives in their preferred blocked layouts,
// reordered from and to NCHW inside each op, the ReLU fused into the forward as a post-op; im2col
// and sgemm (im2col_conv) where oneDNN has only its reference kernel.
// Measured on conv2 of the reference CNN (32->64 channels, 13x13, batch 64, 1 thread): forward
// with ReLU 1.65 ms against 3.6 ms for im2col + OpenBLAS sgemm, backward 3.1 against 7.3 ms.
#include <omp.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/backend_checks.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/dnnl_conv_plan.h"
#include "engine/cpu/dnnl_primitives.h"
#include "engine/cpu/fused_max_pool.h"
#include "engine/cpu/im2col_conv.h"
#include "engine/cpu/nchw16c.h"

namespace kiln {

using cpu_internal::ConvBackwardPlan;
using cpu_internal::ConvForwardPlan;
using cpu_internal::ConvKey;
using cpu_internal::Im2colScratchFloats;

namespace {

// A single input channel's weight gradient is one (OC, KH*KW) x (KH*KW, OHW) GEMM per sample
// that im2col + sgemm does better than oneDNN's blocked kernel, which first interleaves dy into
// 16-channel blocks: the reference CNN's conv1 backward 0.52 ms against 0.74-0.77 ms a step
// (2 threads, quiet machine). Its forward is even (0.37 against 0.40 ms) and stays on oneDNN.
bool Im2colTakesBackward(const Conv2dGeometry& g) { return g.in_channels == 1; }

// The workspace is handed out 64-byte aligned: this much more than a plan asks for.
constexpr int64_t kAlignSlack = 64;

absl::Status WorkspaceError(const Conv2dGeometry& g, int64_t bytes) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "out of memory for the conv2d workspace: ", bytes, " bytes for a ", g.kernel_h, "x",
      g.kernel_w, " kernel over ", g.in_channels, "x", g.in_h, "x", g.in_w, " inputs"));
}

// Makes `threads` the calling thread's team size while it lives: oneDNN sizes a primitive's
// partitioning (and so its scratchpad) from it when the primitive is created.
class ScopedTeamSize {
 public:
  explicit ScopedTeamSize(int threads) : saved_(omp_get_max_threads()) {
    omp_set_num_threads(threads);
  }
  ~ScopedTeamSize() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

// The im2col fallback's scratch, in bytes (saturating: a hostile geometry's is beyond int64).
int64_t Im2colBytes(const Conv2dGeometry& g, int threads, bool backward, bool pooled = false) {
  const auto s = Im2colScratchFloats(g, std::max(1, threads), backward, pooled);
  const double bytes = (static_cast<double>(s.columns) + static_cast<double>(s.partials)) * 4;
  if (bytes >= 9.2e18) return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(bytes);
}

}  // namespace

int64_t CpuBackend::ConvWorkspaceBytes(const Conv2dGeometry& g, int threads, bool backward,
                                       Precision precision) {
  // The plans the ops would make (with and without a bias and a ReLU they differ only by a few
  // floats: the larger, ReLU with bias, is counted), so the count is what the backend allocates.
  if (backward && Im2colTakesBackward(g)) return Im2colBytes(g, threads, backward);
  const ConvKey key{g, /*bias=*/true, Activation::kRelu};
  ScopedTeamSize team(std::max(1, threads));
  const bool bf16 = precision == Precision::kBf16;
  size_t bytes = 0;
  if (backward) {
    auto plan = ConvBackwardPlan::Create(key.g, key.bias, key.act, bf16);
    // A geometry oneDNN cannot plan can never run: no memory makes it fit.
    if (!plan.ok()) return std::numeric_limits<int64_t>::max();
    if ((*plan)->reference_kernel()) return Im2colBytes(g, threads, backward);
    bytes = (*plan)->workspace_bytes();
  } else {
    auto plan = ConvForwardPlan::Create(key.g, key.bias, key.act, bf16);
    if (!plan.ok()) return std::numeric_limits<int64_t>::max();
    if ((*plan)->reference_kernel()) return Im2colBytes(g, threads, backward);
    bytes = (*plan)->workspace_bytes();
  }
  return static_cast<int64_t>(bytes) + kAlignSlack;
}

char* CpuBackend::ConvWorkspace(size_t plan_bytes) {
  const size_t floats = (plan_bytes + kAlignSlack + sizeof(float) - 1) / sizeof(float);
  float* base = Scratch(&workspace_, floats);
  if (base == nullptr) return nullptr;
  const uintptr_t p = reinterpret_cast<uintptr_t>(base);
  return reinterpret_cast<char*>((p + 63) / 64 * 64);
}

const float* CpuBackend::AsNchw(ImageLayout layout, int batch, int channels, int64_t hw,
                                const float* x, int slot) {
  if (layout == ImageLayout::kNchw || x == nullptr) return x;
  float* copy = Scratch(&nchw_copies_[slot], static_cast<size_t>(int64_t{batch} * channels * hw));
  if (copy != nullptr) cpu_internal::Nchw16cToNchw(batch, channels, hw, x, copy, threads_);
  return copy;
}

absl::Status CpuBackend::Im2colForward(const Conv2dGeometry& g, const float* x, const float* w,
                                       const float* bias, Activation act, float* y) {
  const int64_t bytes = Im2colBytes(g, threads_, /*backward=*/false);
  float* scratch = Scratch(&workspace_, static_cast<size_t>(bytes / 4));
  if (scratch == nullptr) return WorkspaceError(g, bytes);
  Conv2dGeometry plain = g;
  plain.x_layout = plain.y_layout = ImageLayout::kNchw;
  const int64_t in_hw = int64_t{g.in_h} * g.in_w, out_hw = int64_t{g.out_h()} * g.out_w();
  const float* px = AsNchw(g.x_layout, g.batch, g.in_channels, in_hw, x, 0);
  float* py = g.y_layout == ImageLayout::kNchw
                  ? y
                  : Scratch(&nchw_copies_[3],
                            static_cast<size_t>(int64_t{g.batch} * g.out_channels * out_hw));
  if (px == nullptr || py == nullptr) return WorkspaceError(g, bytes);
  cpu_internal::Im2colConv2dForward(plain, px, w, bias, act, py, threads_, scratch);
  if (py != y) cpu_internal::NchwToNchw16c(g.batch, g.out_channels, out_hw, py, y, threads_);
  return absl::OkStatus();
}

absl::Status CpuBackend::Im2colBackward(const Conv2dGeometry& g, const float* x, const float* w,
                                        const float* y, const float* dy, Activation act, float* dw,
                                        float* dbias, float* dx) {
  const int64_t bytes = Im2colBytes(g, threads_, /*backward=*/true);
  float* scratch = Scratch(&workspace_, static_cast<size_t>(bytes / 4));
  if (scratch == nullptr) return WorkspaceError(g, bytes);
  Conv2dGeometry plain = g;
  plain.x_layout = plain.y_layout = ImageLayout::kNchw;
  const int64_t in_hw = int64_t{g.in_h} * g.in_w, out_hw = int64_t{g.out_h()} * g.out_w();
  const float* px = AsNchw(g.x_layout, g.batch, g.in_channels, in_hw, x, 0);
  const float* py = AsNchw(g.y_layout, g.batch, g.out_channels, out_hw, y, 1);
  const float* pdy = AsNchw(g.y_layout, g.batch, g.out_channels, out_hw, dy, 2);
  float* pdx = dx == nullptr || g.x_layout == ImageLayout::kNchw
                   ? dx
                   : Scratch(&nchw_copies_[3],
                             static_cast<size_t>(int64_t{g.batch} * g.in_channels * in_hw));
  if (px == nullptr || (y != nullptr && py == nullptr) || pdy == nullptr ||
      (dx != nullptr && pdx == nullptr)) {
    return WorkspaceError(g, bytes);
  }
  cpu_internal::Im2colConv2dBackward(plain, px, w, py, pdy, act, dw, dbias, pdx, threads_, scratch);
  if (pdx != dx) cpu_internal::NchwToNchw16c(g.batch, g.in_channels, in_hw, pdx, dx, threads_);
  return absl::OkStatus();
}

absl::Status CpuBackend::Conv2dForward(const Conv2dGeometry& g, const float* x, const float* w,
                                       const float* bias, Activation act, float* y) {
  KILN_RETURN_IF_ERROR(CheckConv2dLayouts(g, *this));
  KILN_ASSIGN_OR_RETURN(const ConvForwardPlan* plan,
                        dnnl_->Forward(ConvKey{g, bias != nullptr, act}));
  if (plan->reference_kernel()) return Im2colForward(g, x, w, bias, act, y);
  char* workspace = ConvWorkspace(plan->workspace_bytes());
  if (workspace == nullptr) return WorkspaceError(g, plan->workspace_bytes());
  return plan->Run(dnnl_->stream(), x, w, bias, y, workspace);
}

absl::Status CpuBackend::Conv2dBackward(const Conv2dGeometry& g, const float* x, const float* w,
                                        const float* y, const float* dy, Activation act, float* dw,
                                        float* dbias, float* dx) {
  KILN_RETURN_IF_ERROR(CheckConv2dLayouts(g, *this));
  const ConvBackwardPlan* plan = nullptr;
  if (!Im2colTakesBackward(g)) {
    KILN_ASSIGN_OR_RETURN(plan, dnnl_->Backward(ConvKey{g, dbias != nullptr, act}));
  }
  if (plan == nullptr || plan->reference_kernel()) {
    return Im2colBackward(g, x, w, y, dy, act, dw, dbias, dx);
  }
  char* workspace = ConvWorkspace(plan->workspace_bytes());
  if (workspace == nullptr) return WorkspaceError(g, plan->workspace_bytes());
  return plan->Run(dnnl_->stream(), x, w, y, dy, dw, dbias, dx, workspace);
}

// A max pooling fused into the convolution, so that the convolution's whole output is never
// written out in plain NCHW and read back (5.5 MB a step for the reference CNN's conv1):
// - im2col (where the backward is im2col's: one input channel): each sample is pooled while its
//   output is in cache, and the backward expands each sample's pooled gradient there;
// - nChw16c (where oneDNN writes the output and takes dy in 16-channel blocks): the output stays
//   in the blocks for the pooling, and the pooling's backward writes the masked dy straight into
//   the blocks the convolution's backward takes: two reorders and the ReLU's masking pass gone;
// - plain otherwise: the same kernels on a plain output.
// The output itself is not kept: the winners are (a sixteenth of its bytes for 2x2 windows).
absl::StatusOr<CpuBackend::FusedPoolPath> CpuBackend::FusedPoolPathFor(const Conv2dGeometry& g,
                                                                       bool bias, Activation act) {
  if (Im2colTakesBackward(g)) return FusedPoolPath::kIm2col;
  const ConvKey key{g, bias, act};
  KILN_ASSIGN_OR_RETURN(const ConvForwardPlan* forward, dnnl_->Forward(key));
  if (forward->reference_kernel()) return FusedPoolPath::kIm2col;
  if (!forward->dst_blocked16()) return FusedPoolPath::kPlain;
  KILN_ASSIGN_OR_RETURN(const ConvBackwardPlan* backward, dnnl_->Backward(key));
  return !backward->reference_kernel() && backward->diff_dst_blocked16() ? FusedPoolPath::kBlocked16
                                                                         : FusedPoolPath::kPlain;
}

absl::Status CpuBackend::Conv2dMaxPoolForward(const Conv2dGeometry& g, const Pool2dGeometry& pool,
                                              const float* x, const float* w, const float* bias,
                                              Activation act, uint8_t* winners, float* y) {
  KILN_RETURN_IF_ERROR(CheckFusableMaxPool(g, pool));
  KILN_ASSIGN_OR_RETURN(const FusedPoolPath path, FusedPoolPathFor(g, bias != nullptr, act));
  if (path == FusedPoolPath::kIm2col) {
    const int64_t bytes = Im2colBytes(g, threads_, /*backward=*/false, /*pooled=*/true);
    float* scratch = Scratch(&workspace_, static_cast<size_t>(bytes / 4));
    if (scratch == nullptr) return WorkspaceError(g, bytes);
    cpu_internal::Im2colConv2dForward(g, x, w, bias, act, y, threads_, scratch, &pool, winners);
    return absl::OkStatus();
  }
  const bool relu = act == Activation::kRelu;
  const int64_t out_elems = int64_t{g.batch} * g.out_channels * g.out_h() * g.out_w();
  float* out = Scratch(&conv_out_, static_cast<size_t>(out_elems));
  if (out == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of memory for the conv2d's ", out_elems * 4, " bytes of output"));
  }
  if (path == FusedPoolPath::kPlain) {
    KILN_RETURN_IF_ERROR(Conv2dForward(g, x, w, bias, act, out));
    cpu_internal::MaxPoolPlainForward(pool, out, relu, y, winners, threads_);
    return absl::OkStatus();
  }
  KILN_ASSIGN_OR_RETURN(const ConvForwardPlan* plan,
                        dnnl_->Forward(ConvKey{g, bias != nullptr, act}));
  char* workspace = ConvWorkspace(plan->workspace_bytes());
  if (workspace == nullptr) return WorkspaceError(g, plan->workspace_bytes());
  KILN_RETURN_IF_ERROR(plan->RunToBlocked16(dnnl_->stream(), x, w, bias, out, workspace));
  cpu_internal::MaxPoolBlocked16Forward(pool, out, relu, y, winners, threads_);
  return absl::OkStatus();
}

absl::Status CpuBackend::Conv2dMaxPoolBackward(const Conv2dGeometry& g, const Pool2dGeometry& pool,
                                               const float* x, const float* w,
                                               const uint8_t* winners, const float* dy,
                                               Activation act, float* dw, float* dbias, float* dx) {
  KILN_RETURN_IF_ERROR(CheckFusableMaxPool(g, pool));
  KILN_ASSIGN_OR_RETURN(const FusedPoolPath path, FusedPoolPathFor(g, dbias != nullptr, act));
  if (path == FusedPoolPath::kIm2col) {
    const int64_t bytes = Im2colBytes(g, threads_, /*backward=*/true);
    float* scratch = Scratch(&workspace_, static_cast<size_t>(bytes / 4));
    if (scratch == nullptr) return WorkspaceError(g, bytes);
    cpu_internal::Im2colConv2dBackward(g, x, w, /*y=*/nullptr, dy, Activation::kNone, dw, dbias, dx,
                                       threads_, scratch, &pool, winners);
    return absl::OkStatus();
  }
  if (path == FusedPoolPath::kBlocked16) {
    KILN_ASSIGN_OR_RETURN(const ConvBackwardPlan* plan,
                          dnnl_->Backward(ConvKey{g, dbias != nullptr, act}));
    char* workspace = ConvWorkspace(plan->workspace_bytes());
    if (workspace == nullptr) return WorkspaceError(g, plan->workspace_bytes());
    void* blocked = plan->BlockedDiffDst(workspace);
    if (plan->bf16()) {
      cpu_internal::MaxPoolBlocked16Backward(pool, winners, dy, static_cast<uint16_t*>(blocked),
                                             threads_);
    } else {
      cpu_internal::MaxPoolBlocked16Backward(pool, winners, dy, static_cast<float*>(blocked),
                                             threads_);
    }
    return plan->RunFromBlockedDiffDst(dnnl_->stream(), x, w, dw, dbias, dx, workspace);
  }
  const int64_t out_elems = int64_t{g.batch} * g.out_channels * g.out_h() * g.out_w();
  float* grad = Scratch(&pool_grad_, static_cast<size_t>(out_elems));
  if (grad == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of memory for the max pooling's ", out_elems * 4, " bytes of gradient"));
  }
  cpu_internal::MaxPoolPlainBackward(pool, winners, dy, grad, threads_);
  // The ReLU's mask is in the winners already: the convolution's backward runs without it.
  return Conv2dBackward(g, x, w, /*y=*/nullptr, grad, Activation::kNone, dw, dbias, dx);
}

}  // namespace kiln
