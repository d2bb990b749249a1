// Which input pixels a pooling window covers along one axis, clipped to the input, and which
// value wins a max-pooling window: the rules both backends' pooling (engine/cpu/pool_ops.cc,
// fused_max_pool.cc, im2col_conv.cc, engine/cuda/pool_ops.cu) follow. Plain
// C++ that nvcc also compiles for the device.
#pragma once

#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif

namespace kiln {

// Rows (or columns) [lo, hi) of one axis.
struct PoolSpan {
  int lo, hi;
};

// The input rows of output row `o`'s window (`kernel` wide, `stride` apart, behind `pad` implicit
// padding), clipped to [0, size): padded positions are never read. CheckPool2d's padding rule
// leaves at least one real row in every window.
KILN_HOST_DEVICE inline PoolSpan PoolWindow(int o, int stride, int pad, int kernel, int size) {
  const int start = o * stride - pad;
  return {start > 0 ? start : 0, start + kernel < size ? start + kernel : size};
}

// Whether `v`, met after `best` in a max-pooling window's scan order, takes its place: when
// strictly greater, or NaN; a NaN once taken stays (PyTorch's `v > best || isnan(v)`). Every
// max pooling of both backends, fused or not, picks its winners by this.
KILN_HOST_DEVICE inline bool MaxPoolTakes(float v, float best) { return v > best || v != v; }

}  // namespace kiln
