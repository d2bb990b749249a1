#include "engine/cuda/cuda_allocator.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/device_guard.h"

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

std::shared_ptr<CudaCachingAllocator> CudaCachingAllocator::ForDevice(int device) {
  static std::mutex* const mu = new std::mutex;
  static auto* const allocators = new std::map<int, std::weak_ptr<CudaCachingAllocator>>;
  std::lock_guard<std::mutex> lock(*mu);
  std::shared_ptr<CudaCachingAllocator> a = (*allocators)[device].lock();
  if (a == nullptr) {
    a = std::make_shared<CudaCachingAllocator>(device);
    (*allocators)[device] = a;
  }
  return a;
}

CudaCachingAllocator::~CudaCachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  // Nothing to report to from a destructor: a failure here leaves the memory to the driver.
  EmptyCacheLocked().IgnoreError();
}

CudaCachingAllocator::PoolId CudaCachingAllocator::AttachStream(CUstream_st* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  const PoolId id = next_id_++;
  pools_[id].stream = stream;
  return id;
}

void CudaCachingAllocator::DetachStream(PoolId id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(id);
  if (id == 0 || it == pools_.end()) return;
  Pool& idle = pools_[0];
  for (auto& [size, blocks] : it->second.free) {
    auto& to = idle.free[size];
    to.insert(to.end(), blocks.begin(), blocks.end());
  }
  // Its blocks still handed out come back to the idle pool; its counts stay in the device's.
  idle.stats.in_use_bytes += it->second.stats.in_use_bytes;
  idle.stats.cached_bytes += it->second.stats.cached_bytes;
  idle.stats.device_allocs += it->second.stats.device_allocs;
  idle.stats.cache_hits += it->second.stats.cache_hits;
  pools_.erase(it);
}

CudaCachingAllocator::Pool& CudaCachingAllocator::PoolLocked(PoolId id) {
  auto it = pools_.find(id);
  return it != pools_.end() ? it->second : pools_[0];
}

void* CudaCachingAllocator::TakeCachedLocked(Pool& pool, size_t size) {
  auto it = pool.free.find(size);
  if (it == pool.free.end() || it->second.empty()) return nullptr;
  void* block = it->second.back();
  it->second.pop_back();
  pool.stats.cached_bytes -= size;
  return block;
}

absl::StatusOr<void*> CudaCachingAllocator::Allocate(PoolId id, size_t bytes) {
  const size_t size = BlockSize(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  Pool& pool = PoolLocked(id);
  void* block = TakeCachedLocked(pool, size);
  if (block == nullptr && id != 0) block = TakeCachedLocked(pools_[0], size);
  if (block != nullptr) {
    pool.stats.in_use_bytes += size;
    ++pool.stats.cache_hits;
    return block;
  }
  CudaDeviceGuard guard(device_);
  KILN_RETURN_IF_ERROR(guard.status());
  cudaError_t rc = cudaMalloc(&block, size);
  size_t cached = 0;
  for (const auto& [pool_id, p] : pools_) cached += p.stats.cached_bytes;
  if (rc == cudaErrorMemoryAllocation && cached > 0) {
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
        "); this backend holds ", pool.stats.in_use_bytes, " bytes, the device has ", free_bytes,
        " of ", total_bytes, " bytes free (", status.message(), ")"));
  }
  ++pool.stats.device_allocs;
  pool.stats.in_use_bytes += size;
  return block;
}

void CudaCachingAllocator::Free(PoolId id, void* block, size_t bytes) {
  if (block == nullptr) return;
  const size_t size = BlockSize(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  Pool& pool = PoolLocked(id);
  pool.free[size].push_back(block);
  pool.stats.in_use_bytes -= size;
  pool.stats.cached_bytes += size;
}

absl::Status CudaCachingAllocator::EmptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  return EmptyCacheLocked();
}

absl::Status CudaCachingAllocator::EmptyCacheLocked() {
  bool any = false;
  for (const auto& [id, pool] : pools_) any = any || pool.stats.cached_bytes > 0;
  if (!any) return absl::OkStatus();
  CudaDeviceGuard guard(device_);
  KILN_RETURN_IF_ERROR(guard.status());
  // A cached block may still be read by work queued on its stream: let that finish first.
  for (const auto& [id, pool] : pools_) {
    if (pool.stream != nullptr) KILN_CUDA_CHECK(cudaStreamSynchronize(pool.stream));
  }
  absl::Status first;
  for (auto& [id, pool] : pools_) {
    for (auto& [size, blocks] : pool.free) {
      for (void* block : blocks) {
        const cudaError_t rc = cudaFree(block);
        if (rc != cudaSuccess && first.ok()) {
          first = cuda_internal::CallError(rc, "cudaFree(block)", __FILE__, __LINE__);
        }
        pool.stats.cached_bytes -= size;
      }
    }
    pool.free.clear();
  }
  return first;
}

CudaCachingAllocator::Stats CudaCachingAllocator::stats(PoolId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(id);
  return it != pools_.end() ? it->second.stats : Stats{};
}

CudaCachingAllocator::Stats CudaCachingAllocator::device_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats total;
  for (const auto& [id, pool] : pools_) {
    total.in_use_bytes += pool.stats.in_use_bytes;
    total.cached_bytes += pool.stats.cached_bytes;
    total.device_allocs += pool.stats.device_allocs;
    total.cache_hits += pool.stats.cache_hits;
  }
  return total;
}

}  // namespace kiln
