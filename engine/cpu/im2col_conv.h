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
Im2colScratch Im2colScratchFloats(const Conv2dGeometry& g, int threads, bool backward);

void Im2colConv2dForward(const Conv2dGeometry& g, const float* x, const float* w, const float* bias,
                         Activation act, float* y, int threads, float* scratch);
void Im2colConv2dBackward(const Conv2dGeometry& g, const float* x, const float* w, const float* y,
                          const float* dy, Activation act, float* dw, float* dbias, float* dx,
                          int threads, float* scratch);

}  // namespace kiln::cpu_internal
