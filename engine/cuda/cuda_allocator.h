// A caching allocator of device memory for one backend: freed blocks go back to a cache bucketed
// by rounded size and are handed out again, so a training step never calls cudaMalloc/cudaFree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"

struct CUstream_st;

namespace kiln {

class CudaCachingAllocator {
 public:
  struct Stats {
    size_t in_use_bytes = 0;    // blocks handed out and not yet freed
    size_t cached_bytes = 0;    // blocks waiting in the cache
    int64_t device_allocs = 0;  // cudaMalloc calls so far
    int64_t cache_hits = 0;     // allocations served from the cache
  };

  explicit CudaCachingAllocator(int device) : device_(device) {}
  // Returns every cached block to the device. Blocks still handed out are leaked to the driver,
  // which reclaims them with the context; in practice every Buffer's deleter holds a reference,
  // so this runs only after the last one is freed.
  ~CudaCachingAllocator();
  CudaCachingAllocator(const CudaCachingAllocator&) = delete;
  CudaCachingAllocator& operator=(const CudaCachingAllocator&) = delete;

  // Blocks are only ever used on this stream, so a block freed by the host while the stream still
  // reads it is safe to hand out again: its next use is queued behind the last one. Null after
  // the owning backend is gone (no work can be pending then).
  void set_stream(CUstream_st* stream);

  // A block of at least `bytes` (BlockSize(bytes) exactly). When the device is out of memory
  // the cache is emptied and the allocation tried once more; then ResourceExhausted.
  absl::StatusOr<void*> Allocate(size_t bytes);
  // Returns a block from Allocate(bytes) to the cache. Thread-safe, like Allocate.
  void Free(void* block, size_t bytes);
  // Gives every cached block back to the device.
  absl::Status EmptyCache();

  Stats stats() const;

  // The size class of a request: multiples of 512 bytes below 1 MiB, then quarter steps between
  // powers of two (at most 25% rounding), so a recurring shape always hits the same bucket.
  static size_t BlockSize(size_t bytes);

 private:
  absl::Status EmptyCacheLocked();

  const int device_;
  mutable std::mutex mu_;
  CUstream_st* stream_ = nullptr;
  std::unordered_map<size_t, std::vector<void*>> free_;  // block size -> cached blocks
  Stats stats_;
};

}  // namespace kiln
