// The CPU backend's loops over images in nChw16c (ImageLayout::kNchw16c: (batch, channels / 16,
// h, w, 16)) that are not oneDNN's: batch normalisation, average pooling, and the conversions to
// and from NCHW for the paths that run plain (the im2col convolution). A model keeps its
// activations in nChw16c between convolutions, so these run where NCHW loops would need a
// reorder on each side. Channels are a multiple of 16 throughout. Internal to engine/cpu/.
//
// Each output value is computed as its NCHW loop computes it (average pooling: the same sums in
// the same order, so the same bits); batch normalisation's per-channel sums are in double over
// fixed ranges of samples added in a fixed order, so the same bits for any thread count, and
// within rounding of the NCHW loops' (whose SIMD lanes split the sums differently).
#pragma once

#include <cstdint>

#include "engine/backend.h"

namespace kiln::cpu_internal {

// dst (nChw16c) = src (NCHW), and back; `hw` = h * w.
void NchwToNchw16c(int batch, int channels, int64_t hw, const float* src, float* dst, int threads);
void Nchw16cToNchw(int batch, int channels, int64_t hw, const float* src, float* dst, int threads);

// Backend::BatchNorm*'s contracts over x, y, dy, dx in nChw16c (g.spatial = h * w); with `relu`
// Backend::BatchNormRelu*'s (the backward then masks dy where relu_y, the forward's y, is not
// positive).
void BatchNormNchw16cForwardTraining(const BatchNormGeometry& g, double eps, double momentum,
                                     const float* x, const float* gamma, const float* beta,
                                     bool relu, float* y, float* running_mean, float* running_var,
                                     float* saved_mean, float* saved_invstd, int threads);
void BatchNormNchw16cForwardInference(const BatchNormGeometry& g, double eps, const float* x,
                                      const float* gamma, const float* beta,
                                      const float* running_mean, const float* running_var,
                                      bool relu, float* y, int threads);
void BatchNormNchw16cBackward(const BatchNormGeometry& g, const float* x, const float* gamma,
                              const float* saved_mean, const float* saved_invstd,
                              const float* relu_y, const float* dy, float* dgamma, float* dbeta,
                              float* dx, int threads);

// Backend::AvgPool2d*'s contracts over x, y, dy, dx in nChw16c.
void AvgPoolNchw16cForward(const Pool2dGeometry& g, const float* x, float* y, int threads);
void AvgPoolNchw16cBackward(const Pool2dGeometry& g, const float* dy, float* dx, int threads);

}  // namespace kiln::cpu_internal
