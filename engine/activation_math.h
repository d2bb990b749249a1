// The formulas of the ActivationKind activations (engine/backend.h), in float, as the CUDA
// kernels compute them (and the CPU backend its leaky ReLU; its tanh, sigmoid, GELU and SiLU run
// on oneDNN's eltwise primitives, within 3e-7 of the exact values). PyTorch's forms: the backward
// of tanh and sigmoid from the output y, the others from the input x.
#pragma once

#include <math.h>

#ifdef __CUDACC__
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif

namespace kiln::activation_math {

// 1 / sqrt(2) and 1 / sqrt(2 pi), GELU's constants.
inline constexpr float kSqrtHalf = 0.70710678118654752440f;
inline constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

KILN_HOST_DEVICE inline float TanhForward(float x) { return tanhf(x); }
KILN_HOST_DEVICE inline float TanhBackward(float y, float dy) { return dy * (1.0f - y * y); }

KILN_HOST_DEVICE inline float SigmoidForward(float x) { return 1.0f / (1.0f + expf(-x)); }
KILN_HOST_DEVICE inline float SigmoidBackward(float y, float dy) { return dy * (1.0f - y) * y; }

// GELU, exact (erf) form: PyTorch's approximate='none'.
KILN_HOST_DEVICE inline float GeluForward(float x) {
  return x * 0.5f * (1.0f + erff(x * kSqrtHalf));
}
KILN_HOST_DEVICE inline float GeluBackward(float x, float dy) {
  const float cdf = 0.5f * (1.0f + erff(x * kSqrtHalf));
  const float pdf = expf(-0.5f * x * x) * kInvSqrt2Pi;
  return dy * (cdf + x * pdf);
}

KILN_HOST_DEVICE inline float LeakyReluForward(float x, float slope) {
  return x > 0.0f ? x : x * slope;
}
KILN_HOST_DEVICE inline float LeakyReluBackward(float x, float slope, float dy) {
  return x > 0.0f ? dy : dy * slope;
}

KILN_HOST_DEVICE inline float SiluForward(float x) { return x / (1.0f + expf(-x)); }
KILN_HOST_DEVICE inline float SiluBackward(float x, float dy) {
  const float s = 1.0f / (1.0f + expf(-x));
  return dy * s * (1.0f + x * (1.0f - s));
}

}  // namespace kiln::activation_math
