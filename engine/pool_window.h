// Which input pixels a pooling window covers along one axis, clipped to the input: the one rule
// that both backends' pooling (engine/cpu/pool_ops.cc, engine/cuda/pool_ops.cu) follow. Plain
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

}  // namespace kiln
