// What a CUDA backend is made with. Free of CUDA headers, so that the backend registry reads the
// defaults (the memory plan's cuDNN workspace) in every build, with or without nvcc.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/backend.h"

namespace kiln {

// The most workspace a CUDA backend lets one cuDNN convolution use, unless told otherwise.
inline constexpr size_t kCudaConvWorkspaceLimit = size_t{256} << 20;

// Where a bf16 convolution keeps its bfloat16 copies (conv_ops.cu), as byte offsets into one
// buffer of `bytes`: x, w and y for the forward; dy (in `y`), x, w, dw and dx for the backward.
// Each slot 256-byte aligned. The memory plan counts `bytes` from the same layout.
struct CudaBf16ConvSlots {
  int64_t x_elems = 0, w_elems = 0, y_elems = 0;  // values in x (and dx), w (and dw), y (and dy)
  int64_t x = 0, w = 0, y = 0, dw = 0, dx = 0, bytes = 0;
};

inline CudaBf16ConvSlots CudaBf16ConvLayout(const Conv2dGeometry& g, bool backward) {
  CudaBf16ConvSlots s;
  s.x_elems = int64_t{g.batch} * g.in_channels * g.in_h * g.in_w;
  s.w_elems = int64_t{g.out_channels} * g.in_channels * g.kernel_h * g.kernel_w;
  s.y_elems = int64_t{g.batch} * g.out_channels * g.out_h() * g.out_w();
  auto add = [&s](int64_t count) {
    const int64_t at = s.bytes;
    s.bytes += (count * 2 + 255) / 256 * 256;
    return at;
  };
  s.x = add(s.x_elems);
  s.w = add(s.w_elems);
  s.y = add(s.y_elems);
  if (backward) {
    s.dw = add(s.w_elems);
    s.dx = add(s.x_elems);
  }
  return s;
}

struct CudaBackendOptions {
  // TF32 tensor cores for GEMMs and convolutions: about 3x the matrix throughput of float32 with
  // a 10-bit mantissa. Off, results match the CPU backend to ~1e-6.
  bool allow_tf32 = false;
  // bfloat16 products (Precision::kBf16): cuBLAS rounds GEMMs' float32 operands to bfloat16 and
  // accumulates in float32 (CUBLAS_COMPUTE_32F_FAST_16BF); convolutions read bfloat16 copies of
  // x, w and dy and accumulate in float32 (cuDNN's bf16 convolutions, conv_ops.cu).
  bool bf16 = false;
  // Deterministic cuDNN algorithms chosen by heuristics (shape and device only), so every backend
  // and process on this machine computes the same bits; false times each algorithm once per shape
  // and keeps the fastest.
  bool deterministic = true;
  // Most workspace a cuDNN convolution algorithm may take.
  size_t conv_workspace_limit = kCudaConvWorkspaceLimit;
};

}  // namespace kiln
