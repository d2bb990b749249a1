// bfloat16 as the CPU backend makes it for GEMM inputs (Precision::kBf16): a float's upper 16
// bits after rounding to nearest, ties to even. Infinities stay infinities and a NaN stays a NaN
// (quietened, so that rounding cannot carry its payload into an infinity); subnormals round like
// any other value. The same rule as torch's float-to-bfloat16 conversion.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace kiln::cpu_internal {

inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

inline float Bf16ToFloat(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// v as an element of a float32 buffer (as it is) or of a bfloat16 one (FloatToBf16), the
// pointer's type choosing: for kernels templated on the type of what they write.
inline float AsElement(float v, const float*) { return v; }
inline uint16_t AsElement(float v, const uint16_t*) { return FloatToBf16(v); }

// dst[i] = FloatToBf16(src[i]) for i < n in portable code, which the compiler vectorises.
inline void RoundRowToBf16Portable(int64_t n, const float* src, uint16_t* dst) {
#ifdef _OPENMP
#pragma omp simd
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToBf16(src[i]);
}

// The same with AVX512_BF16's vcvtneps2bf16 (bf16.cc), four to five times faster; only where
// CpuHasAvx512Bf16().
void RoundRowToBf16Avx512Bf16(int64_t n, const float* src, uint16_t* dst);
bool CpuHasAvx512Bf16();

// dst[i] = FloatToBf16(src[i]) for i < n on the calling thread alone: for short rows inside a
// parallel loop, where even a parallel region that its if() keeps to one thread costs a call.
inline void RoundRowToBf16(int64_t n, const float* src, uint16_t* dst) {
  static const bool avx512_bf16 = CpuHasAvx512Bf16();
  if (avx512_bf16) return RoundRowToBf16Avx512Bf16(n, src, dst);
  RoundRowToBf16Portable(n, src, dst);
}

// dst[i] = FloatToBf16(src[i]) for i < n, on the calling thread's OpenMP team (where the
// includer is built with OpenMP, as engine/cpu is) in slices of RoundRowToBf16, and on the calling
// thread alone below 64K elements. Not `parallel for simd if (...)`: GCC 12 leaves that loop
// scalar when the if() keeps it on one thread (36 against 8 us for 64K elements, AVX2).
inline void RoundToBf16(int64_t n, const float* src, uint16_t* dst) {
  constexpr int64_t kSlice = int64_t{1} << 14;
  if (n <= 4 * kSlice) return RoundRowToBf16(n, src, dst);
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
  for (int64_t begin = 0; begin < n; begin += kSlice) {
    RoundRowToBf16(std::min(kSlice, n - begin), src + begin, dst + begin);
  }
}

}  // namespace kiln::cpu_internal
