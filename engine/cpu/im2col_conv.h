// Convolution by im2col and OpenBLAS sgemm: the CPU backend's fallback where oneDNN has only its
// reference kernel. Backend::Conv2dForward's and Conv2dBackward's contracts. Internal to
// engine/cpu/.
#pragma once

#include <cstdint>

#include "engine/backend.h"

namespace kiln::cpu_internal {

// The scratch (floats) on `threads` threads: `columns` (the im2col columns; the backward's also
// hold their gradient and the masked output gradient) and `partials` (the backward's per-thread
// weight and bias gradients), in one buffer, columns first.
struct Im2colScratch {
  int64_t columns = 0, partials = 0;
};
// `pooled`: with a fused max pooling (its forward keeps each sample's output in the scratch).
Im2colScratch Im2colScratchFloats(const Conv2dGeometry& g, int threads, bool backward,
                                  bool pooled = false);

// With a max pooling fused into the convolution (`pool`, CheckFusableMaxPool), each sample is
// pooled while its output is in cache, and the backward expands each sample's pooled gradient
// there; the convolution's whole output is never written. `winners` as in fused_max_pool.h
// (plain, one byte per pooled value).

// With `pool`, y is the pooled output and the winners are written.
void Im2colConv2dForward(const Conv2dGeometry& g, const float* x, const float* w, const float* bias,
                         Activation act, float* y, int threads, float* scratch,
                         const Pool2dGeometry* pool = nullptr, uint8_t* winners = nullptr);
// With `pool`, dy is the pooled output's gradient (masked by the winners: act must be kNone)
// and y is not read.
void Im2colConv2dBackward(const Conv2dGeometry& g, const float* x, const float* w, const float* y,
                          const float* dy, Activation act, float* dw, float* dbias, float* dx,
                          int threads, float* scratch, const Pool2dGeometry* pool = nullptr,
                          const uint8_t* winners = nullptr);

}  // namespace kiln::cpu_internal
