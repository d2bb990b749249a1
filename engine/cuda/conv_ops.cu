// CudaBackend's convolutions: cuDNN convolves (conv_cudnn.h picks and caches its algorithms), and
// the bias and the fused ReLU that ride along are kiln's kernels here. The CPU's counterpart is
// engine/cpu/conv_ops.cc.
//
// bf16 (torch.autocast's rule, as the CPU's): cuDNN convolves bfloat16 copies of x, w and dy
// (rounded to nearest even here) with float32 accumulation, and its bfloat16 y, dw and dx are
// widened into the float32 tensors (dw added, as parameter gradients accumulate).
#include <cuda_bf16.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/backend_checks.h"
#include "engine/cuda/conv_cudnn.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/cuda_kernels.h"
#include "engine/cuda/device_math.cuh"

namespace kiln::cuda_kernels {

namespace {

__global__ void conv_bias_act_forward_kernel(int64_t n, int channels, int64_t plane,
                                             const float* bias, bool relu, float* y) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float b = bias != nullptr ? bias[(i / plane) % channels] : 0.0f;
    const float v = y[i] + b;
    y[i] = relu && v < 0.0f ? 0.0f : v;
  }
}

// One block per channel: walks the channel's planes sample by sample.
__global__ void conv_bias_act_backward_kernel(int batch, int channels, int64_t plane,
                                              const float* relu_y, const float* dy, float* masked,
                                              float* dbias) {
  const int c = blockIdx.x;
  float sum = 0.0f;
  for (int n = 0; n < batch; ++n) {
    const int64_t base = (static_cast<int64_t>(n) * channels + c) * plane;
    for (int64_t j = threadIdx.x; j < plane; j += kThreads) {
      float d = dy[base + j];
      if (relu_y != nullptr) d = relu_y[base + j] > 0.0f ? d : 0.0f;
      if (masked != nullptr) masked[base + j] = d;
      sum += d;
    }
  }
  if (dbias == nullptr) return;  // uniform across the block: no thread waits in BlockSum
  sum = BlockSum(sum);
  if (threadIdx.x == 0) dbias[c] += sum;
}

// y(batch, channels, plane) = act(y + bias[channel]); bias may be null.
cudaError_t conv_bias_act_forward(cudaStream_t stream, int batch, int channels, int64_t plane,
                                  const float* bias, Activation act, float* y) {
  const int64_t n = static_cast<int64_t>(batch) * channels * plane;
  if (n <= 0 || (bias == nullptr && act == Activation::kNone)) return cudaSuccess;
  conv_bias_act_forward_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, channels, plane, bias,
                                                                    act == Activation::kRelu, y);
  return cudaGetLastError();
}

// Per channel of dy(batch, channels, plane): d = relu_y ? (relu_y > 0 ? dy : 0) : dy; writes d to
// masked (when not null) and adds its sum over batch and plane to dbias (when not null), in a
// fixed order.
cudaError_t conv_bias_act_backward(cudaStream_t stream, int batch, int channels, int64_t plane,
                                   const float* relu_y, const float* dy, float* masked,
                                   float* dbias) {
  if (batch <= 0 || channels <= 0 || plane <= 0) return cudaSuccess;
  conv_bias_act_backward_kernel<<<channels, kThreads, 0, stream>>>(batch, channels, plane, relu_y,
                                                                   dy, masked, dbias);
  return cudaGetLastError();
}

__global__ void to_bf16_kernel(int64_t n, const float* in, __nv_bfloat16* out) {
  // Round to nearest even; NaN stays NaN and infinity infinity.
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) out[i] = __float2bfloat16_rn(in[i]);
}

__global__ void from_bf16_kernel(int64_t n, const __nv_bfloat16* in, bool accumulate, float* out) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float v = __bfloat162float(in[i]);
    out[i] = accumulate ? out[i] + v : v;
  }
}

cudaError_t to_bf16(cudaStream_t stream, int64_t n, const float* in, void* out) {
  if (n <= 0) return cudaSuccess;
  to_bf16_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, in, static_cast<__nv_bfloat16*>(out));
  return cudaGetLastError();
}

// out = in (or out += in where accumulate), widened from bfloat16.
cudaError_t from_bf16(cudaStream_t stream, int64_t n, const void* in, bool accumulate, float* out) {
  if (n <= 0) return cudaSuccess;
  from_bf16_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, static_cast<const __nv_bfloat16*>(in),
                                                        accumulate, out);
  return cudaGetLastError();
}

}  // namespace

}  // namespace kiln::cuda_kernels

namespace kiln {

namespace {
namespace ck = cuda_kernels;

// What a failed cuDNN call was working on: "conv2d forward 64x1x28x28 -> 32 kernel 3x3 ...".
std::string ConvContext(const Conv2dGeometry& g, const char* pass) {
  return absl::StrCat("conv2d ", pass, " ", g.batch, "x", g.in_channels, "x", g.in_h, "x", g.in_w,
                      " -> ", g.out_channels, " kernel ", g.kernel_h, "x", g.kernel_w, " stride ",
                      g.stride_h, "x", g.stride_w, " padding ", g.padding_h, "x", g.padding_w);
}

}  // namespace

absl::Status CudaBackend::Conv2dForward(const Conv2dGeometry& g, const float* x, const float* w,
                                        const float* bias, Activation act, float* y) {
  KILN_RETURN_IF_ERROR(CheckConv2dLayouts(g, *this));
  if (g.batch == 0) return absl::OkStatus();  // as on the CPU: nothing to do
  KILN_RETURN_IF_ERROR(Activate());
  const WorkspaceFn workspace = [this](size_t bytes) {
    return GetScratch(Scratch::kWorkspace, bytes);
  };
  const int64_t plane = int64_t{g.out_h()} * g.out_w();
  if (options_.bf16) {
    const CudaBf16ConvSlots at = CudaBf16ConvLayout(g, /*backward=*/false);
    KILN_ASSIGN_OR_RETURN(void* buf, GetScratch(Scratch::kBf16Copies, at.bytes));
    char* base = static_cast<char*>(buf);
    KILN_CUDA_CHECK(ck::to_bf16(stream_, at.x_elems, x, base + at.x));
    KILN_CUDA_CHECK(ck::to_bf16(stream_, at.w_elems, w, base + at.w));
    if (absl::Status s = convs_->Forward(g, base + at.x, base + at.w, base + at.y, workspace);
        !s.ok()) {
      return cuda_internal::Annotate(s, ConvContext(g, "forward"));
    }
    KILN_CUDA_CHECK(ck::from_bf16(stream_, at.y_elems, base + at.y, /*accumulate=*/false, y));
  } else if (absl::Status s = convs_->Forward(g, x, w, y, workspace); !s.ok()) {
    return cuda_internal::Annotate(s, ConvContext(g, "forward"));
  }
  KILN_CUDA_CHECK(ck::conv_bias_act_forward(stream_, g.batch, g.out_channels, plane, bias, act, y));
  return absl::OkStatus();
}

absl::Status CudaBackend::Conv2dBackward(const Conv2dGeometry& g, const float* x, const float* w,
                                         const float* y, const float* dy, Activation act, float* dw,
                                         float* dbias, float* dx) {
  KILN_RETURN_IF_ERROR(CheckConv2dLayouts(g, *this));
  if (g.batch == 0) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(Activate());
  const int64_t plane = int64_t{g.out_h()} * g.out_w();
  const int64_t out_elems = int64_t{g.batch} * g.out_channels * plane;
  // The gradient at the convolution's output: dy through the fused ReLU's mask when there is one.
  const float* grad = dy;
  if (act == Activation::kRelu) {
    KILN_ASSIGN_OR_RETURN(void* tmp, GetScratch(Scratch::kTemp, out_elems * sizeof(float)));
    float* masked = static_cast<float*>(tmp);
    if (dbias != nullptr) {
      KILN_CUDA_CHECK(ck::conv_bias_act_backward(stream_, g.batch, g.out_channels, plane, y, dy,
                                                 masked, dbias));
    } else {
      KILN_CUDA_CHECK(ck::relu_backward(stream_, out_elems, y, dy, masked));
    }
    grad = masked;
  } else if (dbias != nullptr) {
    KILN_CUDA_CHECK(ck::conv_bias_act_backward(stream_, g.batch, g.out_channels, plane, nullptr, dy,
                                               nullptr, dbias));
  }
  if (options_.bf16) return Conv2dBackwardBf16(g, x, w, grad, dw, dx);
  const WorkspaceFn workspace = [this](size_t bytes) {
    return GetScratch(Scratch::kWorkspace, bytes);
  };
  if (dw != nullptr) {
    if (absl::Status s = convs_->BackwardFilter(g, x, grad, dw, workspace); !s.ok()) {
      return cuda_internal::Annotate(s, ConvContext(g, "backward-filter"));
    }
  }
  if (dx != nullptr) {
    if (absl::Status s = convs_->BackwardData(g, w, grad, dx, workspace); !s.ok()) {
      return cuda_internal::Annotate(s, ConvContext(g, "backward-data"));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Conv2dBackwardBf16(const Conv2dGeometry& g, const float* x,
                                             const float* w, const float* grad, float* dw,
                                             float* dx) {
  const CudaBf16ConvSlots at = CudaBf16ConvLayout(g, /*backward=*/true);
  KILN_ASSIGN_OR_RETURN(void* buf, GetScratch(Scratch::kBf16Copies, at.bytes));
  char* base = static_cast<char*>(buf);
  const WorkspaceFn workspace = [this](size_t bytes) {
    return GetScratch(Scratch::kWorkspace, bytes);
  };
  KILN_CUDA_CHECK(ck::to_bf16(stream_, at.y_elems, grad, base + at.y));
  if (dw != nullptr) {
    KILN_CUDA_CHECK(ck::to_bf16(stream_, at.x_elems, x, base + at.x));
    // cuDNN adds into its bfloat16 dw: from zero, then widened and added to the float32 dw.
    KILN_CUDA_CHECK(cudaMemsetAsync(base + at.dw, 0, at.w_elems * 2, stream_));
    if (absl::Status s =
            convs_->BackwardFilter(g, base + at.x, base + at.y, base + at.dw, workspace);
        !s.ok()) {
      return cuda_internal::Annotate(s, ConvContext(g, "backward-filter"));
    }
    KILN_CUDA_CHECK(ck::from_bf16(stream_, at.w_elems, base + at.dw, /*accumulate=*/true, dw));
  }
  if (dx != nullptr) {
    KILN_CUDA_CHECK(ck::to_bf16(stream_, at.w_elems, w, base + at.w));
    if (absl::Status s = convs_->BackwardData(g, base + at.w, base + at.y, base + at.dx, workspace);
        !s.ok()) {
      return cuda_internal::Annotate(s, ConvContext(g, "backward-data"));
    }
    KILN_CUDA_CHECK(ck::from_bf16(stream_, at.x_elems, base + at.dx, /*accumulate=*/false, dx));
  }
  return absl::OkStatus();
}

}  // namespace kiln
