#include "engine/cuda/cuda_allocator.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_check.h"
#include "engine/status_macros.h"

namespace kiln {

namespace {

constexpr size_t kSmallStep = 512;
constexpr size_t kSmallLimit = size_t{1} << 20;

}  // namespace

size_t CudaCachingAllocator::BlockSize(size_t bytes) {
  if (bytes < kSmallLimit)
    return std::max(kSmallStep, (bytes + kSmallStep - 1) / kSmallStep * kSmallStep);
  size_t power = kSmallLimit;
  while (power <= bytes / 2) power *= 2;  // largest power of two <= bytes
  const size_t step = power / 4;
  return (bytes + step - 1) / step * step;
}

CudaCachingAllocator::~CudaCachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  // Nothing to report to from a destructor: a failure here leaves the memory to the driver.
  EmptyCacheLocked().IgnoreError();
}

void CudaCachingAllocator::set_stream(CUstream_st* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  stream_ = stream;
}

absl::StatusOr<void*> CudaCachingAllocator::Allocate(size_t bytes) {
  const size_t size = BlockSize(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = free_.find(size);
  if (it != free_.end() && !it->second.empty()) {
    void* block = it->second.back();
    it->second.pop_back();
    stats_.cached_bytes -= size;
    stats_.in_use_bytes += size;
    ++stats_.cache_hits;
    return block;
  }
  KILN_CUDA_CHECK(cudaSetDevice(device_));
  void* block = nullptr;
  cudaError_t rc = cudaMalloc(&block, size);
  if (rc == cudaErrorMemoryAllocation && stats_.cached_bytes > 0) {
    cudaGetLastError();
    KILN_RETURN_IF_ERROR(EmptyCacheLocked());
    rc = cudaMalloc(&block, size);
  }
  if (rc != cudaSuccess) {
    absl::Status status =
        cuda_internal::CallError(rc, "cudaMalloc(&block, size)", __FILE__, __LINE__);
    if (rc != cudaErrorMemoryAllocation) return status;
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrCat(
        "cuda:", device_, ": out of device memory allocating ", bytes, " bytes (block ", size,
        "); this backend holds ", stats_.in_use_bytes, " bytes, the device has ", free_bytes,
        " of ", total_bytes, " bytes free (", status.message(), ")"));
  }
  ++stats_.device_allocs;
  stats_.in_use_bytes += size;
  return block;
}

void CudaCachingAllocator::Free(void* block, size_t bytes) {
  if (block == nullptr) return;
  const size_t size = BlockSize(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  free_[size].push_back(block);
  stats_.in_use_bytes -= size;
  stats_.cached_bytes += size;
}

absl::Status CudaCachingAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  return EmptyCacheLocked();
}

absl::Status CudaCachingAllocator::EmptyCacheLocked() {
  if (stats_.cached_bytes == 0) return absl::OkStatus();
  KILN_CUDA_CHECK(cudaSetDevice(device_));
  // A cached block may still be read by queued work; let that finish before the memory goes.
  if (stream_ != nullptr) KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  absl::Status first;
  for (auto& [size, blocks] : free_) {
    for (void* block : blocks) {
      const cudaError_t rc = cudaFree(block);
      if (rc != cudaSuccess && first.ok()) {
        first = cuda_internal::CallError(rc, "cudaFree(block)", __FILE__, __LINE__);
      }
      stats_.cached_bytes -= size;
    }
    blocks.clear();
  }
  free_.clear();
  return first;
}

CudaCachingAllocator::Stats CudaCachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace kiln
