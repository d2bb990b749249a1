#include "engine/cpu/bf16.h"

#include <immintrin.h>

namespace kiln::cpu_internal {

bool CpuHasAvx512Bf16() {
#if defined(__x86_64__) && defined(__GNUC__)
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
#else
  return false;
#endif
}

#if defined(__x86_64__) && defined(__GNUC__)
// vcvtneps2bf16 rounds to nearest even and quietens a NaN exactly as FloatToBf16 does, but reads
// subnormal inputs as zero: a group of 16 holding one goes through FloatToBf16 instead.
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void RoundRowToBf16Avx512Bf16(
    int64_t n, const float* src, uint16_t* dst) {
  const __m512i exponent = _mm512_set1_epi32(0x7f800000), magnitude = _mm512_set1_epi32(0x7fffffff);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_loadu_si512(src + i);
    // Subnormal: a zero exponent under a nonzero magnitude.
    const __mmask16 subnormal =
        _mm512_mask_cmpeq_epi32_mask(_mm512_test_epi32_mask(u, magnitude),
                                     _mm512_and_si512(u, exponent), _mm512_setzero_si512());
    if (subnormal != 0) {
      for (int64_t j = i; j < i + 16; ++j) dst[j] = FloatToBf16(src[j]);
      continue;
    }
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_castsi512_ps(u));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), reinterpret_cast<const __m256i&>(h));
  }
  for (; i < n; ++i) dst[i] = FloatToBf16(src[i]);
}
#else
void RoundRowToBf16Avx512Bf16(int64_t n, const float* src, uint16_t* dst) {
  RoundRowToBf16Portable(n, src, dst);
}
#endif

}  // namespace kiln::cpu_internal
