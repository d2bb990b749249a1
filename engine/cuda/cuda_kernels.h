// The few kernels and records that several files of engine/cuda/ share; every other kernel is
// private to the op file that launches it (elementwise_ops.cu, pool_ops.cu, ...). Launchers run on
// the given stream, return the launch's cudaError_t and launch nothing for empty inputs; pointers
// are device memory. Internal to engine/cuda/.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kiln::cuda_kernels {

// Bad input a kernel found, written to host-mapped memory with the first failure winning, and
// read by the host after the stream is synchronised (CudaBackend::SyncAndCheckKernelErrors; the
// loss kernels of loss_ops.cu write it).
enum KernelErrorCode : int32_t { kNoKernelError = 0, kLabelOutOfRange = 1 };
enum KernelOp : int32_t { kOpSoftmaxCrossEntropy = 1, kOpOneHot = 2 };
struct KernelErrorRecord {
  int32_t code;   // KernelErrorCode
  int32_t op;     // KernelOp
  int32_t value;  // the offending label
  int32_t limit;  // the number of classes
};

// --- elementwise_ops.cu ----------------------------------------------------------------------
// dst[0:n] = the 32-bit pattern `bits` (a float or an int32): Fill, and the NaN of a loss over no
// rows.
cudaError_t fill_u32(cudaStream_t stream, int64_t n, uint32_t bits, void* dst);
// dx = dy where y > 0 else 0: ReLU's backward, and that of a ReLU fused into a convolution.
cudaError_t relu_backward(cudaStream_t stream, int64_t n, const float* y, const float* dy,
                          float* dx);

}  // namespace kiln::cuda_kernels
