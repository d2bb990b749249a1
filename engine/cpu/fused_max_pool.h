// Max pooling of non-overlapping windows (CheckFusableMaxPool) over a convolution's output, in
// plain NCHW or in oneDNN's nChw16c; the pooled output is always plain NCHW. The forward records
// each window's winner as one byte (its position in scan order, or kMaskedWinner where the
// fused ReLU zeroes the gradient) in the layout of the convolution's output, so the backward
// never reads that output again: it writes the input gradient whole from the winners and dy, in
// the layout the convolution's backward takes (for a blocked one that replaces the reorder of
// dy and the ReLU's masking pass). Winners follow MaxPool2dForward's rule (PyTorch's scan order;
// a later value wins when strictly greater, or NaN) and every gradient value is what
// MaxPool2dBackward then the ReLU's mask give, so the fused layers compute exactly what the
// separate ones do. Internal to engine/cpu/.
#pragma once

#include <cstdint>

#include "engine/backend.h"

namespace kiln::cpu_internal {

// y (plain) = max over each window of x (plain); winners (plain, one byte per y value).
void MaxPoolPlainForward(const Pool2dGeometry& g, const float* x, bool relu, float* y,
                         uint8_t* winners, int threads);
// y (plain) = max over each window of x (nChw16c; g.channels % 16 == 0); winners in nChw16c.
void MaxPoolBlocked16Forward(const Pool2dGeometry& g, const float* x, bool relu, float* y,
                             uint8_t* winners, int threads);

// dx (plain) = dy at each window's recorded winner, zero elsewhere (and where masked).
void MaxPoolPlainBackward(const Pool2dGeometry& g, const uint8_t* winners, const float* dy,
                          float* dx, int threads);
// The same from winners in nChw16c, dx written in nChw16c: float32, or bfloat16 (rounded to
// nearest even, bf16.h) for a bf16 convolution's backward.
void MaxPoolBlocked16Backward(const Pool2dGeometry& g, const uint8_t* winners, const float* dy,
                              float* dx, int threads);
void MaxPoolBlocked16Backward(const Pool2dGeometry& g, const uint8_t* winners, const float* dy,
                              uint16_t* dx, int threads);

}  // namespace kiln::cpu_internal
