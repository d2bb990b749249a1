// A convolution of one geometry as oneDNN primitives: the convolution in the layouts oneDNN
// prefers for it (channels in blocks of 16 on AVX-512) and the reorders between those and the
// backend's plain NCHW/OIHW tensors. Built once per geometry and kept by the backend. Internal to
// engine/cpu/.
//
// Every buffer a plan needs beside its operands (the blocked copies and the primitives' shared
// scratchpad) lies in one workspace the caller passes in, of workspace_bytes(): the backend keeps
// one, grown to the largest plan, and the memory planner counts it from the same plans.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace kiln::cpu_internal {

// A plain tensor brought into (or out of) a primitive's layout, through a slot of the workspace;
// a no-op where the primitive takes the plain layout as it is.
struct Staging {
  bool needed = false;
  dnnl::memory::desc plain, staged;
  dnnl::reorder reorder;  // plain -> staged for inputs, staged -> plain for outputs
  size_t offset = 0;      // of the staged copy in the workspace
};

// bf16 (Precision::kBf16, torch.autocast's rule): the convolution reads x, w and dy as bfloat16,
// rounded to nearest even by the reorders that stage them, and accumulates into float32 y, dw and
// dx. Where oneDNN has only its reference kernel for the bfloat16 form of a geometry (no
// AVX512_BF16 kernel for it), the plan is the float32 one instead and bf16() says false.

// y = act(conv(x, w) + bias): Backend::Conv2dForward's contract, ReLU fused as a post-op.
class ConvForwardPlan {
 public:
  static absl::StatusOr<std::unique_ptr<ConvForwardPlan>> Create(const Conv2dGeometry& g, bool bias,
                                                                 Activation act, bool bf16);
  size_t workspace_bytes() const { return workspace_bytes_; }
  // Whether oneDNN has only its reference kernel for this geometry (hours for a huge kernel).
  bool reference_kernel() const { return reference_kernel_; }
  // Whether x and w are read as bfloat16.
  bool bf16() const { return bf16_; }
  // Whether it runs Winograd's F(4x4, 3x3) rather than the direct kernel (float32 3x3 stride-1
  // convolutions of 32 and more channels: AlgorithmsFor in the .cc says where and why).
  bool winograd() const { return winograd_; }
  // `workspace` is 64-byte aligned and of workspace_bytes().
  absl::Status Run(const dnnl::stream& stream, const float* x, const float* w, const float* bias,
                   float* y, char* workspace) const;
  // Whether the convolution writes its output in nChw16c (channels a multiple of 16, so as many
  // floats as plain), which RunToBlocked16 leaves it in.
  bool dst_blocked16() const { return dst_blocked16_; }
  // Run, with y left in nChw16c rather than reordered to NCHW; only where dst_blocked16().
  absl::Status RunToBlocked16(const dnnl::stream& stream, const float* x, const float* w,
                              const float* bias, float* y, char* workspace) const;

 private:
  ConvForwardPlan() = default;
  static absl::StatusOr<std::unique_ptr<ConvForwardPlan>> Build(const Conv2dGeometry& g, bool bias,
                                                                Activation act, bool bf16);
  absl::Status Execute(const dnnl::stream& stream, const float* x, const float* w,
                       const float* bias, float* y, bool keep_blocked, char* workspace) const;
  bool reference_kernel_ = false;
  bool bf16_ = false;
  bool winograd_ = false;
  bool dst_blocked16_ = false;
  dnnl::memory::desc bias_md_;
  dnnl::convolution_forward conv_;
  Staging src_, weights_, dst_;
  size_t scratchpad_offset_ = 0, workspace_bytes_ = 0;
  dnnl::memory::desc scratchpad_md_;
};

// dw += d/dw, dbias += d/dbias, dx = d/dx from the gradient of the activated output:
// Backend::Conv2dBackward's contract. The ReLU's mask is applied in the plain layout first.
class ConvBackwardPlan {
 public:
  static absl::StatusOr<std::unique_ptr<ConvBackwardPlan>> Create(const Conv2dGeometry& g,
                                                                  bool bias, Activation act,
                                                                  bool bf16);
  size_t workspace_bytes() const { return workspace_bytes_; }
  bool reference_kernel() const { return reference_kernel_; }
  // Whether x, w and dy are read as bfloat16.
  bool bf16() const { return bf16_; }
  // Whether the data gradient, and the weight gradient, run Winograd's kernel.
  bool winograd_data() const { return winograd_data_; }
  bool winograd_weights() const { return winograd_weights_; }
  absl::Status Run(const dnnl::stream& stream, const float* x, const float* w, const float* y,
                   const float* dy, float* dw, float* dbias, float* dx, char* workspace) const;
  // Whether both primitives take dy in nChw16c (channels a multiple of 16): a caller may then
  // write dy, already masked, straight into BlockedDiffDst (float32, or bfloat16 where bf16())
  // and call RunFromBlockedDiffDst (the fused max pooling's backward does), saving the reorder.
  bool diff_dst_blocked16() const { return diff_dst_blocked16_; }
  void* BlockedDiffDst(char* workspace) const { return workspace + diff_dst_w_.offset; }
  absl::Status RunFromBlockedDiffDst(const dnnl::stream& stream, const float* x, const float* w,
                                     float* dw, float* dbias, float* dx, char* workspace) const;

 private:
  ConvBackwardPlan() = default;
  static absl::StatusOr<std::unique_ptr<ConvBackwardPlan>> Build(const Conv2dGeometry& g, bool bias,
                                                                 Activation act, bool bf16);
  // Both primitives, from dy in the weight gradient's layout (`diff_dst_w`) and, where the data
  // gradient's differs, in plain (`dy`).
  absl::Status Execute(const dnnl::stream& stream, const float* x, const float* w,
                       const dnnl::memory& diff_dst_w, const float* dy, float* dw, float* dbias,
                       float* dx, char* workspace, const dnnl::memory& scratchpad) const;
  // The ReLU's backward straight into dy's nChw16c copy: blocked = (y > 0 ? dy : 0), reordered
  // (and rounded to bfloat16 where bf16()).
  void MaskIntoBlocks(const float* y, const float* dy, void* blocked) const;

  Activation act_ = Activation::kNone;
  bool reference_kernel_ = false;
  bool bf16_ = false;
  bool winograd_data_ = false, winograd_weights_ = false;
  bool mask_into_blocks_ = false, diff_dst_blocked16_ = false;
  int64_t out_elems_ = 0, out_hw_ = 0;
  int out_channels_ = 0;
  dnnl::memory::desc bias_md_;
  dnnl::convolution_backward_weights backward_weights_;
  dnnl::convolution_backward_data backward_data_;
  // The masked output gradient (plain, when act is ReLU) and the bias gradient (plain).
  size_t masked_offset_ = 0, dbias_offset_ = 0;
  // For the weight gradient: x and dy in its layouts, its dw added into the plain dw.
  Staging src_w_, diff_dst_w_, diff_weights_;
  // For the input gradient: dy (shared with diff_dst_w_ where the layouts agree), w, dx.
  Staging diff_dst_d_, weights_d_, diff_src_;
  bool diff_dst_shared_ = false;
  size_t scratchpad_offset_ = 0, workspace_bytes_ = 0;
  dnnl::memory::desc scratchpad_md_;
};

}  // namespace kiln::cpu_internal
