// The one check around every CUDA runtime, cuBLAS and cuDNN call (and every kernel launcher):
// a failure becomes an absl::Status naming the call, file and line; out of memory becomes
// ResourceExhausted. Never exits or aborts. Internal to engine/cuda/.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <string>

#include "absl/status/status.h"

namespace kiln::cuda_internal {

inline bool Succeeded(cudaError_t rc) { return rc == cudaSuccess; }
inline bool Succeeded(cublasStatus_t rc) { return rc == CUBLAS_STATUS_SUCCESS; }
inline bool Succeeded(cudnnStatus_t rc) { return rc == CUDNN_STATUS_SUCCESS; }

// "<call> failed at <file>:<line>: <library's name and text for rc>".
absl::Status CallError(cudaError_t rc, const char* call, const char* file, int line);
absl::Status CallError(cublasStatus_t rc, const char* call, const char* file, int line);
absl::Status CallError(cudnnStatus_t rc, const char* call, const char* file, int line);

// `s` with `context` (what the op was working on) before its message; OK passes through.
absl::Status Annotate(absl::Status s, const std::string& context);

}  // namespace kiln::cuda_internal

// Returns the failure of `call` (a cudaError_t, cublasStatus_t or cudnnStatus_t expression) from
// the enclosing absl::Status-returning function.
#define KILN_CUDA_CHECK(call)                                                            \
  do {                                                                                   \
    const auto kiln_cuda_rc_ = (call);                                                   \
    if (!::kiln::cuda_internal::Succeeded(kiln_cuda_rc_)) {                              \
      return ::kiln::cuda_internal::CallError(kiln_cuda_rc_, #call, __FILE__, __LINE__); \
    }                                                                                    \
  } while (0)
