// CpuBackend's batch gathering: uint8 samples to normalised floats.
#include <omp.h>

#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/cpu_parallel.h"

namespace kiln {

using cpu_internal::kParallelMin;

absl::Status CpuBackend::GatherNormalize(int count, int64_t sample_elems, const int32_t* index,
                                         const uint8_t* pixels, const int32_t* labels,
                                         const PixelNorm& norm, float* out, int32_t* labels_out) {
  // x = (u8 * scale - mean) / std, folded into one multiply-add per pixel.
  const float a = norm.scale / norm.std, b = -norm.mean / norm.std;
#pragma omp parallel for num_threads(threads_) if (count * sample_elems > kParallelMin)
  for (int i = 0; i < count; ++i) {
    const uint8_t* src = pixels + static_cast<int64_t>(index[i]) * sample_elems;
    float* dst = out + static_cast<int64_t>(i) * sample_elems;
#pragma omp simd
    for (int64_t j = 0; j < sample_elems; ++j) dst[j] = static_cast<float>(src[j]) * a + b;
  }
  if (labels_out != nullptr) {
    for (int i = 0; i < count; ++i) labels_out[i] = labels[index[i]];
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Normalize(int64_t n, const float* x, const PixelNorm& norm, float* out) {
  const float a = norm.scale / norm.std, b = -norm.mean / norm.std;  // as GatherNormalize
#pragma omp parallel for simd num_threads(threads_) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * a + b;
  return absl::OkStatus();
}

}  // namespace kiln
