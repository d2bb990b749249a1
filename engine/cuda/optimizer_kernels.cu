// Optimizer updates, one fused pass over a parameter and its state: SGD (momentum, dampening,
// Nesterov, weight decay) and Adam/AdamW, with PyTorch's formulas as the CPU backend writes them.
#include "engine/cuda/cuda_kernels.h"
#include "engine/cuda/device_math.cuh"

namespace kiln::cuda_kernels {

namespace {

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

}  // namespace

cudaError_t sgd_update(cudaStream_t stream, int64_t n, const SgdConstants& c, float* param,
                       const float* grad, float* momentum_buf) {
  if (n <= 0) return cudaSuccess;
  sgd_update_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, c, param, grad, momentum_buf);
  return cudaGetLastError();
}

cudaError_t adam_update(cudaStream_t stream, int64_t n, const AdamConstants& c, float* param,
                        const float* grad, float* exp_avg, float* exp_avg_sq) {
  if (n <= 0) return cudaSuccess;
  adam_update_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, c, param, grad, exp_avg, exp_avg_sq);
  return cudaGetLastError();
}

}  // namespace kiln::cuda_kernels
