// CudaBackend's batch assembly on the device, with its kernels: gathers samples of a uint8 dataset
// by index and normalises them to float32 (x = u8 * a[c] + b[c], c the element's channel), with
// their labels, so only the index list ever crosses the bus.
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "engine/backend_checks.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/device_math.cuh"
#include "engine/pixel_norm.h"

namespace kiln::cuda_kernels {

namespace {

// A FoldedNorm (engine/pixel_norm.h) passed by value (2 KiB of kernel parameters): element j of a
// sample is in channel (j / plane) % channels and becomes x * a[c] + b[c].
struct NormFold {
  int channels;
  int64_t plane;
  float a[kMaxNormChannels];
  float b[kMaxNormChannels];
};

// grid.y = sample, grid.x * blockDim.x covers the sample's elements of T (uint8 pixels, float
// features); kVec = 4 takes four pixels at a time, where every sample starts 4-byte aligned
// (sample_elems % 4 == 0: MNIST's 784).
template <typename T, int kVec>
__global__ void gather_normalize_kernel(int64_t sample_elems, const int32_t* index, const T* data,
                                        const int32_t* labels, const NormFold norm, float* out,
                                        int32_t* labels_out) {
  static_assert(kVec == 1 || std::is_same_v<T, uint8_t>, "vectors of four are uint8 pixels");
  const int sample = blockIdx.y;
  const int64_t src_row = index[sample];
  if (labels_out != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
    labels_out[sample] = labels[src_row];
  }
  const T* src = data + src_row * sample_elems;
  float* dst = out + static_cast<int64_t>(sample) * sample_elems;
  const int64_t vecs = sample_elems / kVec;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < vecs;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // kVec divides the plane, so the kVec elements share a channel.
    const int c = static_cast<int>(v * kVec / norm.plane);
    const float a = norm.a[c], b = norm.b[c];
    if constexpr (kVec == 4) {
      const uchar4 q = reinterpret_cast<const uchar4*>(src)[v];
      reinterpret_cast<float4*>(dst)[v] =
          make_float4(static_cast<float>(q.x) * a + b, static_cast<float>(q.y) * a + b,
                      static_cast<float>(q.z) * a + b, static_cast<float>(q.w) * a + b);
    } else {
      dst[v] = static_cast<float>(src[v]) * a + b;
    }
  }
}

// grid.y = sample, grid.x * blockDim.x covers the sample's C*H*W outputs: output (c, y, x) reads
// padded pixel (y + dy, dx + (flip ? W - 1 - x : x)), i.e. source (that - padding), or 0 outside.
// Positions within a sample are 32-bit (CheckAugmentGeometry bounds C*H*W): 64-bit division is
// several times slower on the GPU.
__global__ void gather_augment_normalize_kernel(AugmentGeometry s, const int32_t* index,
                                                const uint8_t* pixels, const int32_t* labels,
                                                const CropFlip* decisions, const NormFold norm,
                                                float* out, int32_t* labels_out) {
  const int sample = blockIdx.y;
  const int64_t src_row = index[sample];
  if (labels_out != nullptr && blockIdx.x == 0 && threadIdx.x == 0) {
    labels_out[sample] = labels[src_row];
  }
  const CropFlip d = decisions[sample];
  const int plane = s.height * s.width;
  const int elems = plane * s.channels;
  const int norm_plane = static_cast<int>(norm.plane);  // plane or elems: 1 or C channels
  const uint8_t* src = pixels + src_row * elems;
  float* dst = out + static_cast<int64_t>(sample) * elems;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < elems; j += gridDim.x * blockDim.x) {
    const int c = j / plane;
    const int y = (j - c * plane) / s.width;
    const int x = j - c * plane - y * s.width;
    const int sy = y + d.dy - s.padding;
    const int sx = (d.flip != 0 ? s.width - 1 - x : x) + d.dx - s.padding;
    const bool inside = sy >= 0 && sy < s.height && sx >= 0 && sx < s.width;
    const float v = inside ? static_cast<float>(src[c * plane + sy * s.width + sx]) : 0.0f;
    const int k = j / norm_plane;  // the normalisation's channel
    dst[j] = v * norm.a[k] + norm.b[k];
  }
}

__global__ void normalize_kernel(int64_t n, const float* x, const NormFold norm, float* out) {
  for (int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const int c = static_cast<int>((i / norm.plane) % norm.channels);
    out[i] = x[i] * norm.a[c] + norm.b[c];
  }
}

// out(n) = x * a[c] + b[c] over whole samples (n a multiple of channels * plane); out may be x.
cudaError_t normalize(cudaStream_t stream, int64_t n, const float* x, const NormFold& norm,
                      float* out) {
  if (n <= 0 || norm.plane <= 0) return cudaSuccess;
  normalize_kernel<<<GridFor(n), kThreads, 0, stream>>>(n, x, norm, out);
  return cudaGetLastError();
}

// Samples go along grid.y, which holds at most 65535: runs launch(first, grid) for each run of
// at most that many samples from `first`, with `blocks_x` blocks along x, and returns the first
// launch's error.
template <typename Launch>
cudaError_t LaunchBySamples(int count, unsigned blocks_x, Launch launch) {
  constexpr int kMaxSamplesPerLaunch = 65535;
  for (int first = 0; first < count; first += kMaxSamplesPerLaunch) {
    const int n = count - first < kMaxSamplesPerLaunch ? count - first : kMaxSamplesPerLaunch;
    launch(first, dim3(blocks_x, static_cast<unsigned>(n)));
    const cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess) return rc;
  }
  return cudaSuccess;
}

// Blocks along x for `work` items of one sample: enough of kThreads to cover them, 1 to 64.
unsigned SampleBlocks(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks < 64 ? blocks : 64);
}

// out(count, sample_elems) = data[index[i]] * a[c] + b[c] from uint8 pixels or float features;
// labels_out[i] = labels[index[i]] when labels_out is not null.
template <typename T>
cudaError_t gather_normalize(cudaStream_t stream, int count, int64_t sample_elems,
                             const int32_t* index, const T* data, const int32_t* labels,
                             const NormFold& norm, float* out, int32_t* labels_out) {
  constexpr bool kPixels = std::is_same_v<T, uint8_t>;
  // Empty float samples launch nothing, so their labels stay unwritten, unlike the pixels' and
  // the CPU's; kept as it was.
  if (count <= 0 || (!kPixels && norm.plane <= 0)) return cudaSuccess;
  bool vec4 = false;
  if constexpr (kPixels) {
    vec4 = norm.plane % 4 == 0 && reinterpret_cast<uintptr_t>(data) % 4 == 0 &&
           reinterpret_cast<uintptr_t>(out) % 16 == 0;
  }
  const unsigned blocks_x = SampleBlocks(vec4 ? sample_elems / 4 : sample_elems);
  return LaunchBySamples(count, blocks_x, [&](int first, dim3 grid) {
    float* dst = out + static_cast<int64_t>(first) * sample_elems;
    int32_t* lab = labels_out != nullptr ? labels_out + first : nullptr;
    if constexpr (kPixels) {
      if (vec4) {
        gather_normalize_kernel<T, 4><<<grid, kThreads, 0, stream>>>(sample_elems, index + first,
                                                                     data, labels, norm, dst, lab);
        return;
      }
    }
    gather_normalize_kernel<T, 1>
        <<<grid, kThreads, 0, stream>>>(sample_elems, index + first, data, labels, norm, dst, lab);
  });
}

// out(count, C*H*W) = norm(padded pixels[index[i]] cropped at decisions[i], mirrored when its
// flip is set); a padded pixel is norm(0). labels_out[i] = labels[index[i]] when not null.
cudaError_t gather_augment_normalize(cudaStream_t stream, int count, const AugmentGeometry& shape,
                                     const int32_t* index, const uint8_t* pixels,
                                     const int32_t* labels, const CropFlip* decisions,
                                     const NormFold& norm, float* out, int32_t* labels_out) {
  if (count <= 0 || norm.plane <= 0) return cudaSuccess;
  const int64_t elems = static_cast<int64_t>(shape.channels) * shape.height * shape.width;
  return LaunchBySamples(count, SampleBlocks(elems), [&](int first, dim3 grid) {
    gather_augment_normalize_kernel<<<grid, kThreads, 0, stream>>>(
        shape, index + first, pixels, labels, decisions + first, norm,
        out + static_cast<int64_t>(first) * elems,
        labels_out != nullptr ? labels_out + first : nullptr);
  });
}

}  // namespace

}  // namespace kiln::cuda_kernels

namespace kiln {

namespace {
namespace ck = cuda_kernels;

// The folded normalisation as the kernels take it, by value.
absl::StatusOr<ck::NormFold> KernelNorm(const PixelNorm& norm, int64_t sample_elems) {
  KILN_ASSIGN_OR_RETURN(const FoldedNorm f, FoldPixelNorm(norm, sample_elems));
  ck::NormFold k{};
  k.channels = static_cast<int>(f.a.size());
  k.plane = f.plane;
  for (int c = 0; c < k.channels; ++c) {
    k.a[c] = f.a[c];
    k.b[c] = f.b[c];
  }
  return k;
}

}  // namespace

absl::Status CudaBackend::GatherNormalize(int count, int64_t sample_elems, const int32_t* index,
                                          const uint8_t* pixels, const int32_t* labels,
                                          const PixelNorm& norm, float* out, int32_t* labels_out) {
  KILN_RETURN_IF_ERROR(Activate());
  // x = (u8 * scale - mean[c]) / std[c], folded into one multiply-add per pixel as on the CPU.
  KILN_ASSIGN_OR_RETURN(const ck::NormFold k, KernelNorm(norm, sample_elems));
  KILN_CUDA_CHECK(ck::gather_normalize(stream_, count, sample_elems, index, pixels, labels, k, out,
                                       labels_out));
  return absl::OkStatus();
}

absl::Status CudaBackend::GatherNormalizeF32(int count, int64_t sample_elems, const int32_t* index,
                                             const float* features, const int32_t* labels,
                                             const PixelNorm& norm, float* out,
                                             int32_t* labels_out) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_ASSIGN_OR_RETURN(const ck::NormFold k, KernelNorm(norm, sample_elems));
  KILN_CUDA_CHECK(ck::gather_normalize(stream_, count, sample_elems, index, features, labels, k,
                                       out, labels_out));
  return absl::OkStatus();
}

absl::Status CudaBackend::GatherAugmentNormalize(int count, const AugmentGeometry& g,
                                                 const int32_t* index, const uint8_t* pixels,
                                                 const int32_t* labels, const CropFlip* decisions,
                                                 const PixelNorm& norm, float* out,
                                                 int32_t* labels_out) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_RETURN_IF_ERROR(CheckAugmentGeometry(g, norm.channels()));
  KILN_ASSIGN_OR_RETURN(const ck::NormFold k, KernelNorm(norm, g.sample_elems()));
  KILN_CUDA_CHECK(ck::gather_augment_normalize(stream_, count, g, index, pixels, labels, decisions,
                                               k, out, labels_out));
  return absl::OkStatus();
}

absl::Status CudaBackend::Normalize(int count, int64_t sample_elems, const float* x,
                                    const PixelNorm& norm, float* out) {
  KILN_RETURN_IF_ERROR(Activate());
  KILN_ASSIGN_OR_RETURN(const ck::NormFold k, KernelNorm(norm, sample_elems));  // as Gather...
  KILN_CUDA_CHECK(ck::normalize(stream_, int64_t{count} * sample_elems, x, k, out));
  return absl::OkStatus();
}

}  // namespace kiln
