// CpuBackend's batch gathering: uint8 samples to normalised floats.
#include <omp.h>

#include "common/status_macros.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/cpu_parallel.h"

namespace kiln {

using cpu_internal::kParallelMin;

absl::Status CpuBackend::GatherNormalize(int count, int64_t sample_elems, const int32_t* index,
                                         const uint8_t* pixels, const int32_t* labels,
                                         const PixelNorm& norm, float* out, int32_t* labels_out) {
  // x = (u8 * scale - mean[c]) / std[c], folded into one multiply-add per pixel.
  KILN_ASSIGN_OR_RETURN(const FoldedNorm f, FoldPixelNorm(norm, sample_elems));
  const int channels = static_cast<int>(f.a.size());
#pragma omp parallel for num_threads(threads_) if (count * sample_elems > kParallelMin)
  for (int i = 0; i < count; ++i) {
    const uint8_t* src = pixels + static_cast<int64_t>(index[i]) * sample_elems;
    float* dst = out + static_cast<int64_t>(i) * sample_elems;
    for (int c = 0; c < channels; ++c) {
      const float a = f.a[c], b = f.b[c];
      const int64_t first = c * f.plane;
#pragma omp simd
      for (int64_t j = first; j < first + f.plane; ++j) dst[j] = static_cast<float>(src[j]) * a + b;
    }
  }
  if (labels_out != nullptr) {
    for (int i = 0; i < count; ++i) labels_out[i] = labels[index[i]];
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::GatherNormalizeF32(int count, int64_t sample_elems, const int32_t* index,
                                            const float* features, const int32_t* labels,
                                            const PixelNorm& norm, float* out,
                                            int32_t* labels_out) {
  KILN_ASSIGN_OR_RETURN(const FoldedNorm f, FoldPixelNorm(norm, sample_elems));
  const int channels = static_cast<int>(f.a.size());
#pragma omp parallel for num_threads(threads_) if (count * sample_elems > kParallelMin)
  for (int i = 0; i < count; ++i) {
    const float* src = features + static_cast<int64_t>(index[i]) * sample_elems;
    float* dst = out + static_cast<int64_t>(i) * sample_elems;
    for (int c = 0; c < channels; ++c) {
      const float a = f.a[c], b = f.b[c];
      const int64_t first = c * f.plane;
#pragma omp simd
      for (int64_t j = first; j < first + f.plane; ++j) dst[j] = src[j] * a + b;
    }
  }
  if (labels_out != nullptr) {
    for (int i = 0; i < count; ++i) labels_out[i] = labels[index[i]];
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Normalize(int count, int64_t sample_elems, const float* x,
                                   const PixelNorm& norm, float* out) {
  KILN_ASSIGN_OR_RETURN(const FoldedNorm f, FoldPixelNorm(norm, sample_elems));  // as Gather...
  const int channels = static_cast<int>(f.a.size());
#pragma omp parallel for num_threads(threads_) if (count * sample_elems > kParallelMin)
  for (int i = 0; i < count; ++i) {
    const int64_t row = static_cast<int64_t>(i) * sample_elems;
    for (int c = 0; c < channels; ++c) {
      const float a = f.a[c], b = f.b[c];
      const int64_t first = row + c * f.plane;
#pragma omp simd
      for (int64_t j = first; j < first + f.plane; ++j) out[j] = x[j] * a + b;
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln
