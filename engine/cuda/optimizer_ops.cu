// CudaBackend's optimizer updates with their kernels, one fused pass over a parameter and its
// state: SGD (momentum, dampening, Nesterov, weight decay) and Adam/AdamW, with PyTorch's formulas
// as the CPU backend writes them; and the sum of squares gradient clipping takes the global norm
// from, in two passes (per-block partials, then one block adding them) so the order is fixed.
#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "engine/adam_constants.h"
#include "engine/backend_checks.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/device_math.cuh"

namespace kiln::cuda_kernels {

namespace {

struct SgdConstants {
  float lr, momentum, dampening, weight_decay;
  bool nesterov;
  bool seed_buffer;  // first step: the momentum buffer becomes the gradient
};

__global__ void sgd_update_kernel(int64_t n, SgdConstants h, float* param, const float* grad,
                                  float* momentum_buf) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    float d = grad[i] + h.weight_decay * param[i];
    if (h.momentum != 0.0f) {
      const float buf = h.seed_buffer ? d : h.momentum * momentum_buf[i] + (1.0f - h.dampening) * d;
      momentum_buf[i] = buf;
      d = h.nesterov ? d + h.momentum * buf : buf;
    }
    param[i] -= h.lr * d;
  }
}

__global__ void adam_update_kernel(int64_t n, AdamConstants h, float* param, const float* grad,
                                   float* exp_avg, float* exp_avg_sq) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float p = param[i] * h.param_scale;
    const float g = grad[i] + h.grad_decay * p;
    const float m = h.beta1 * exp_avg[i] + (1.0f - h.beta1) * g;
    const float v = h.beta2 * exp_avg_sq[i] + (1.0f - h.beta2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = p - h.step_size * m / (sqrtf(v) / h.bias2_sqrt + h.eps);
  }
}

cudaError_t sgd_update(cudaStream_t stream, int64_t n, const SgdConstants& c, float* param,
                       const float* grad, float* momentum_buf) {
  if (n <= 0) return cudaSuccess;
  sgd_update_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, c, param, grad, momentum_buf);
  return cudaGetLastError();
}

// One Adam/AdamW step with the constants FoldAdamHyper gives (engine/adam_constants.h).
cudaError_t adam_update(cudaStream_t stream, int64_t n, const AdamConstants& c, float* param,
                        const float* grad, float* exp_avg, float* exp_avg_sq) {
  if (n <= 0) return cudaSuccess;
  adam_update_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, c, param, grad, exp_avg, exp_avg_sq);
  return cudaGetLastError();
}

// partial[block] = sum of x^2 over the block's grid-stride share, in double.
__global__ void squares_partial_kernel(int64_t n, const float* x, double* partial) {
  double total = 0.0;
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    total += static_cast<double>(x[i]) * x[i];
  }
  total = BlockSum(total);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// out[0] += the blocks' partials, summed by one block in a fixed order (no float atomics).
__global__ void squares_add_kernel(int blocks, const double* partial, float* out) {
  double total = 0.0;
  for (int b = threadIdx.x; b < blocks; b += kThreads) total += partial[b];
  total = BlockSum(total);
  if (threadIdx.x == 0) out[0] = static_cast<float>(static_cast<double>(out[0]) + total);
}

// Bytes of scratch sum_of_squares needs: a double per block.
int64_t sum_of_squares_scratch_bytes(int64_t n) {
  return static_cast<int64_t>(GridFor(n)) * static_cast<int64_t>(sizeof(double));
}

// out[0] += sum of x(n)^2. The grid depends on n alone, so the partials and their order do too.
cudaError_t sum_of_squares(cudaStream_t stream, int64_t n, const float* x, float* out,
                           void* scratch) {
  if (n <= 0) return cudaSuccess;
  const unsigned blocks = GridFor(n);
  double* partial = static_cast<double*>(scratch);
  squares_partial_kernel<<<blocks, kThreads, 0, stream>>>(n, x, partial);
  const cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess) return rc;
  squares_add_kernel<<<1, kThreads, 0, stream>>>(static_cast<int>(blocks), partial, out);
  return cudaGetLastError();
}

}  // namespace

}  // namespace kiln::cuda_kernels

namespace kiln {

namespace ck = cuda_kernels;

absl::Status CudaBackend::SgdUpdate(int64_t n, const SgdHyper& h, MomentumBuffer buffer,
                                    float* param, const float* grad, float* momentum_buf) {
  if (h.momentum != 0.0f && momentum_buf == nullptr) {
    return absl::InvalidArgumentError("SgdUpdate: momentum needs a momentum buffer");
  }
  KILN_RETURN_IF_ERROR(Activate());
  const ck::SgdConstants c{h.lr,           h.momentum, h.dampening,
                           h.weight_decay, h.nesterov, buffer == MomentumBuffer::kSeed};
  KILN_CUDA_CHECK(ck::sgd_update(stream_, n, c, param, grad, momentum_buf));
  return absl::OkStatus();
}

absl::Status CudaBackend::AdamUpdate(int64_t n, const AdamHyper& h, float* param, const float* grad,
                                     float* exp_avg, float* exp_avg_sq) {
  KILN_RETURN_IF_ERROR(Activate());
  // The CPU backend's constants (FoldAdamHyper), so both run the same float arithmetic.
  KILN_CUDA_CHECK(ck::adam_update(stream_, n, FoldAdamHyper(h), param, grad, exp_avg, exp_avg_sq));
  return absl::OkStatus();
}

absl::Status CudaBackend::SumOfSquares(int64_t n, const float* x, float* out) {
  KILN_RETURN_IF_ERROR(CheckSumOfSquares(n, out));
  if (n == 0) return absl::OkStatus();
  KILN_RETURN_IF_ERROR(Activate());
  KILN_ASSIGN_OR_RETURN(void* scratch,
                        GetScratch(Scratch::kTemp, static_cast<size_t>(std::max<int64_t>(
                                                       ck::sum_of_squares_scratch_bytes(n), 8))));
  KILN_CUDA_CHECK(ck::sum_of_squares(stream_, n, x, out, scratch));
  return absl::OkStatus();
}

}  // namespace kiln
