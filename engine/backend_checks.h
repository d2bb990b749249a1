// The input checks every backend makes before an op, so that the CPU and CUDA backends refuse the
// same inputs with the same messages. Each returns InvalidArgument naming the op and what is
// wrong, or OK.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "engine/augment_geometry.h"
#include "engine/backend.h"

namespace kiln {

// Before an op over images (`op` names it) of `channels` channels in `layout`: nChw16c only on a
// backend that TakesNchw16c, and for a channel count that is a multiple of 16.
absl::Status CheckImageLayout(const char* op, ImageLayout layout, int channels,
                              const Backend& backend);
// Before a convolution: CheckImageLayout for x and y.
absl::Status CheckConv2dLayouts(const Conv2dGeometry& g, const Backend& backend);

// Before a batch normalisation on `backend`: a non-negative geometry, eps > 0 and, in training,
// more than one value per channel (an unbiased variance needs two), as PyTorch; then
// CheckImageLayout.
absl::Status CheckBatchNorm(const BatchNormGeometry& g, double eps, bool training,
                            const Backend& backend);

// Before GatherAugmentNormalize: a geometry of whole images, and a normalisation of one channel or
// one per image channel (torchvision normalises per channel).
absl::Status CheckAugmentGeometry(const AugmentGeometry& g, int norm_channels);

// Before a copy: `bytes` must fit the `capacity` of the tensors involved.
absl::Status CheckCopyFits(const char* op, size_t bytes, size_t capacity);

// Before pooling (`op` names it: "maxpool2d", "avgpool2d"): a window of at least 1 that fits the
// padded input, and padding at most half the window (PyTorch's rule; it also keeps a real pixel in
// every window).
absl::Status CheckPool2d(const char* op, const Pool2dGeometry& g);
// Before max pooling: CheckPool2d's rules, over images in NCHW (no backend max-pools nChw16c).
absl::Status CheckMaxPool2d(const Pool2dGeometry& g);
// Before average pooling on `backend`: CheckPool2d's rules, then CheckImageLayout.
absl::Status CheckAvgPool2d(const Pool2dGeometry& g, const Backend& backend);

// A fused max pooling records each window's winner as a byte: its position in scan order
// (a * kernel_w + b), or this where the fused ReLU passes no gradient.
inline constexpr uint8_t kMaskedWinner = 255;

// Whether max pooling of geometry `pool` over the output of convolution `g` can run fused into
// it (Backend::Conv2dMaxPoolForward): non-overlapping windows without padding, of fewer than
// kMaskedWinner positions, over exactly the convolution's output, all in NCHW.
absl::Status CheckFusableMaxPool(const Conv2dGeometry& g, const Pool2dGeometry& pool);

// Before a softmax cross-entropy: at least one class, no negative row count, a label smoothing in
// [0, 1]. Zero rows is allowed: the loss is NaN (a mean over nothing) and correct is 0.
absl::Status CheckSoftmaxCrossEntropy(int rows, int cols, float label_smoothing = 0);

// Before a Copy2D: no negative size, rows no longer than either stride.
absl::Status CheckCopy2D(int64_t rows, int64_t cols, int64_t src_stride, int64_t dst_stride);

// Before a layer normalisation: rows >= 0, cols >= 1, eps > 0 and finite.
absl::Status CheckLayerNorm(int64_t rows, int cols, float eps);

// Before an embedding lookup: count >= 0, vocab >= 1, dim >= 1.
absl::Status CheckEmbedding(int64_t count, int vocab, int dim);

// Before a strided batched GEMM: m, n, k, batch >= 0, and strides >= 0 and large enough that the
// batch's matrices do not overlap in c (those of a and b may: a stride of 0 repeats a matrix).
absl::Status CheckGemmStridedBatched(int m, int n, int k, int64_t stride_a, int64_t stride_b,
                                     int64_t stride_c, int batch);

// Before a causal softmax: batch >= 0, t >= 1, scale finite and > 0.
absl::Status CheckCausalSoftmax(int64_t batch, int t, float scale);
// Before a causal softmax at an offset: batch >= 0, queries >= 1, offset >= 0,
// offset + queries <= keys (every query's position has its
// key), scale finite and > 0.
absl::Status CheckCausalSoftmaxAt(int64_t batch, int queries, int keys, int offset, float scale);

// Before Transpose0213: every extent >= 0.
absl::Status CheckTranspose0213(int64_t a, int64_t b, int64_t c, int64_t d);

// Before SumOfSquares: n >= 0 and an output scalar to add to.
absl::Status CheckSumOfSquares(int64_t n, const float* out);

}  // namespace kiln
