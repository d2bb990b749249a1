// The caching allocator of one CUDA device, shared by every backend on it: freed blocks go back to
// a cache bucketed by rounded size and are handed out again, so a training step never calls
// cudaMalloc/cudaFree, and when the device runs out of memory every backend's cache is given back
// before an allocation fails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
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
  // Names the pool of one stream (never reused); 0 is the idle pool, whose blocks no queued work
  // can still read.
  using PoolId = uint64_t;

  // The allocator of CUDA device `device`: one per device for as long as a backend or a tensor
  // holds it, so backends (jobs, served models) on one GPU share one cache. Thread-safe.
  static std::shared_ptr<CudaCachingAllocator> ForDevice(int device);

  explicit CudaCachingAllocator(int device) : device_(device) {}
  // Returns every cached block to the device. Blocks still handed out are leaked to the driver,
  // which reclaims them with the context; in practice every Buffer's deleter holds a reference,
  // so this runs only after the last one is freed.
  ~CudaCachingAllocator();
  CudaCachingAllocator(const CudaCachingAllocator&) = delete;
  CudaCachingAllocator& operator=(const CudaCachingAllocator&) = delete;

  // A pool for the blocks used on `stream`. A block freed by the host while its stream may still
  // read it is safe to hand out again on that stream only (its next use queues behind the last),
  // so each stream reuses its own blocks and those of the idle pool.
  PoolId AttachStream(CUstream_st* stream);
  // After `pool`'s stream has finished its work and before it is destroyed: its cached blocks, and
  // blocks freed under its id from now on, join the idle pool.
  void DetachStream(PoolId pool);

  // A block of at least `bytes` (BlockSize(bytes) exactly) for use on `pool`'s stream. When the
  // device is out of memory, every pool's cache is given back and the allocation tried once
  // more; then ResourceExhausted.
  absl::StatusOr<void*> Allocate(PoolId pool, size_t bytes);
  // Returns a block from Allocate(pool, bytes) to the cache of `pool`.
  void Free(PoolId pool, void* block, size_t bytes);
  // Waits for every attached stream, then gives every cached block back to the device.
  absl::Status EmptyCache();

  Stats stats(PoolId pool) const;  // one pool's
  Stats device_stats() const;      // every pool's together

  // The size class of a request: multiples of 512 bytes below 1 MiB, then quarter steps between
  // powers of two (at most 25% rounding), so a recurring shape always hits the same bucket.
  static size_t BlockSize(size_t bytes);

 private:
  struct Pool {
    CUstream_st* stream = nullptr;
    std::unordered_map<size_t, std::vector<void*>> free;  // block size -> cached blocks
    Stats stats;
  };

  Pool& PoolLocked(PoolId id);  // the idle pool for ids detached or unknown
  void* TakeCachedLocked(Pool& pool, size_t size);
  absl::Status EmptyCacheLocked();

  const int device_;
  mutable std::mutex mu_;
  PoolId next_id_ = 1;
  std::map<PoolId, Pool> pools_{{0, Pool{}}};
};

}  // namespace kiln
