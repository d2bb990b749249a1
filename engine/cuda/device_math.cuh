// Device-side helpers shared by kiln's kernels: launch geometry, warp and block reductions in a
// fixed order (so results are the same on every run), the CPU's argmax rule, and the counter hash
// of engine/rng.h. Included only by the .cu files of engine/cuda/.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::cuda_kernels {

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr int kMaxBlocks = 4096;  // grid-stride loops: enough to fill 132 SMs several times

inline unsigned GridFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

__device__ __forceinline__ int64_t GlobalThread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t GridThreads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// Butterfly sums: IEEE addition is commutative, so every lane ends with the same bits.
template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over a block of kThreads threads in a fixed tree; the result is valid in thread 0. Every
// thread of the block must call it.
template <typename T>
__device__ __forceinline__ T BlockSum(T v) {
  __shared__ T partial[kThreads / kWarp];
  __syncthreads();  // a previous call's partials may still be being read
  v = WarpSum(v);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  T total = 0;
  if (threadIdx.x == 0) {
    for (int w = 0; w < kThreads / kWarp; ++w) total += partial[w];
  }
  return total;
}

// A candidate for the row maximum: the CPU backend takes the first index whose value is
// strictly greater than all before it, which over non-NaN values is the smallest index of the
// largest value. index < 0 means no candidate (only NaNs seen).
struct ArgmaxCandidate {
  float value;
  int index;
};

__device__ __forceinline__ ArgmaxCandidate BetterOf(ArgmaxCandidate a, ArgmaxCandidate b) {
  if (a.index < 0) return b;
  if (b.index < 0) return a;
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

// The argmax of row z[0:cols] by the CPU's rule (`z[c] > z[best]` from best = 0), computed by a
// whole warp; every lane returns it. A NaN at column 0 wins (nothing compares greater); NaNs
// elsewhere are never taken.
__device__ __forceinline__ int WarpRowArgmax(const float* z, int cols, int lane) {
  ArgmaxCandidate best{0.0f, -1};
  for (int c = lane; c < cols; c += kWarp) {
    const float v = z[c];
    if (v == v && (best.index < 0 || v > best.value)) best = {v, c};
  }
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    ArgmaxCandidate other;
    other.value = __shfl_xor_sync(0xffffffffu, best.value, offset);
    other.index = __shfl_xor_sync(0xffffffffu, best.index, offset);
    best = BetterOf(best, other);
  }
  const float first = z[0];
  return (first != first || best.index < 0) ? 0 : best.index;
}

// engine/rng.h's SplitMix64 and CounterUniform, operation for operation.
__device__ __forceinline__ uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
__device__ __forceinline__ float CounterUniform(uint64_t seed, uint64_t index) {
  return static_cast<float>(SplitMix64(seed ^ SplitMix64(index)) >> 40) * (1.0f / 16777216.0f);
}

}  // namespace kiln::cuda_kernels
