// CpuBackend's batch gathering: uint8 samples to normalised floats, with crop and flip for
// augmented training batches.
#include <omp.h>

#include <algorithm>

#include "common/status_macros.h"
#include "engine/backend_checks.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/cpu_parallel.h"

namespace kiln {

using cpu_internal::kParallelMin;

namespace {

// labels_out[i] = labels[index[i]] when labels_out is not null.
void GatherLabels(int count, const int32_t* index, const int32_t* labels, int32_t* labels_out) {
  if (labels_out == nullptr) return;
  for (int i = 0; i < count; ++i) labels_out[i] = labels[index[i]];
}

// GatherNormalize over samples of T (uint8 pixels, float features), on `threads` threads: each
// value x becomes x * a[c] + b[c], one multiply-add.
template <typename T>
absl::Status GatherFolded(int threads, int count, int64_t sample_elems, const int32_t* index,
                          const T* data, const int32_t* labels, const PixelNorm& norm, float* out,
                          int32_t* labels_out) {
  KILN_ASSIGN_OR_RETURN(const FoldedNorm f, FoldPixelNorm(norm, sample_elems));
  const int channels = static_cast<int>(f.a.size());
#pragma omp parallel for num_threads(threads) if (count * sample_elems > kParallelMin)
  for (int i = 0; i < count; ++i) {
    const T* src = data + static_cast<int64_t>(index[i]) * sample_elems;
    float* dst = out + static_cast<int64_t>(i) * sample_elems;
    for (int c = 0; c < channels; ++c) {
      const float a = f.a[c], b = f.b[c];
      const int64_t first = c * f.plane;
#pragma omp simd
      for (int64_t j = first; j < first + f.plane; ++j) dst[j] = static_cast<float>(src[j]) * a + b;
    }
  }
  GatherLabels(count, index, labels, labels_out);
  return absl::OkStatus();
}

}  // namespace

absl::Status CpuBackend::GatherNormalize(int count, int64_t sample_elems, const int32_t* index,
                                         const uint8_t* pixels, const int32_t* labels,
                                         const PixelNorm& norm, float* out, int32_t* labels_out) {
  // x = (u8 * scale - mean[c]) / std[c], folded into one multiply-add per pixel.
  return GatherFolded(threads_, count, sample_elems, index, pixels, labels, norm, out, labels_out);
}

absl::Status CpuBackend::GatherNormalizeF32(int count, int64_t sample_elems, const int32_t* index,
                                            const float* features, const int32_t* labels,
                                            const PixelNorm& norm, float* out,
                                            int32_t* labels_out) {
  return GatherFolded(threads_, count, sample_elems, index, features, labels, norm, out,
                      labels_out);
}

absl::Status CpuBackend::GatherAugmentNormalize(int count, const AugmentGeometry& g,
                                                const int32_t* index, const uint8_t* pixels,
                                                const int32_t* labels, const CropFlip* decisions,
                                                const PixelNorm& norm, float* out,
                                                int32_t* labels_out) {
  KILN_RETURN_IF_ERROR(CheckAugmentGeometry(g, norm.channels()));
  const int64_t elems = g.sample_elems();
  KILN_ASSIGN_OR_RETURN(const FoldedNorm f, FoldPixelNorm(norm, elems));
  const int64_t plane = int64_t{g.height} * g.width;
  const int w = g.width;
#pragma omp parallel for num_threads(threads_) if (count * elems > kParallelMin)
  for (int i = 0; i < count; ++i) {
    const uint8_t* src = pixels + static_cast<int64_t>(index[i]) * elems;
    float* dst = out + static_cast<int64_t>(i) * elems;
    const CropFlip d = decisions[i];
    const bool flip = d.flip != 0;
    // Output column x reads source column first + x, or first - x when mirrored; the columns
    // [lo, hi) of a row read the image, the rest padding.
    const int first = flip ? w - 1 + d.dx - g.padding : d.dx - g.padding;
    const int lo = std::clamp(flip ? first - (w - 1) : -first, 0, w);
    const int hi = std::clamp(flip ? first + 1 : w - first, lo, w);
    for (int c = 0; c < g.channels; ++c) {
      const int k = static_cast<int>(c * plane / f.plane);  // the normalisation's channel
      const float a = f.a[k], b = f.b[k];
      for (int y = 0; y < g.height; ++y) {
        float* row = dst + c * plane + int64_t{y} * w;
        const int sy = y + d.dy - g.padding;
        if (sy < 0 || sy >= g.height) {
          std::fill(row, row + w, b);  // b = norm(0): a padded row
          continue;
        }
        const uint8_t* in = src + c * plane + int64_t{sy} * w;
        std::fill(row, row + lo, b);
        if (flip) {
          for (int x = lo; x < hi; ++x) row[x] = static_cast<float>(in[first - x]) * a + b;
        } else {
#pragma omp simd
          for (int x = lo; x < hi; ++x) row[x] = static_cast<float>(in[first + x]) * a + b;
        }
        std::fill(row + hi, row + w, b);
      }
    }
  }
  GatherLabels(count, index, labels, labels_out);
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
