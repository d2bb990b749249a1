// What a CUDA backend is made with. Free of CUDA headers, so that the backend registry reads the
// defaults (the memory plan's cuDNN workspace) in every build, with or without nvcc.
#pragma once

#include <cstddef>

namespace kiln {

// The most workspace a CUDA backend lets one cuDNN convolution use, unless told otherwise.
inline constexpr size_t kCudaConvWorkspaceLimit = size_t{256} << 20;

struct CudaBackendOptions {
  // TF32 tensor cores for GEMMs and convolutions: about 3x the matrix throughput of float32 with
  // a 10-bit mantissa. Off, results match the CPU backend to ~1e-6.
  bool allow_tf32 = false;
  // bfloat16 GEMMs (Precision::kBf16): cuBLAS rounds the float32 operands to bfloat16 and
  // accumulates in float32 (CUBLAS_COMPUTE_32F_FAST_16BF). Convolutions stay float32.
  bool bf16_gemm = false;
  // Deterministic cuDNN algorithms chosen by heuristics (shape and device only), so every backend
  // and process on this machine computes the same bits; false times each algorithm once per shape
  // and keeps the fastest.
  bool deterministic = true;
  // Most workspace a cuDNN convolution algorithm may take.
  size_t conv_workspace_limit = kCudaConvWorkspaceLimit;
};

}  // namespace kiln
