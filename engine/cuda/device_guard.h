// Makes a CUDA device current for a scope and restores the thread's previous one after it, so
// code that serves one device (an allocator, a backend's teardown) leaves the caller's choice as
// it found it.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "engine/cuda/cuda_check.h"

namespace kiln {

class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device) {
    const cudaError_t got = cudaGetDevice(&previous_);
    if (got != cudaSuccess) {
      status_ = cuda_internal::CallError(got, "cudaGetDevice", __FILE__, __LINE__);
      previous_ = -1;
      return;
    }
    if (previous_ == device) {
      previous_ = -1;  // nothing to change, nothing to restore
      return;
    }
    const cudaError_t set = cudaSetDevice(device);
    if (set != cudaSuccess) {
      status_ = cuda_internal::CallError(set, "cudaSetDevice", __FILE__, __LINE__);
      previous_ = -1;
    }
  }
  ~CudaDeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

  // Whether the device could be made current; callers return it when not OK.
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

}  // namespace kiln
