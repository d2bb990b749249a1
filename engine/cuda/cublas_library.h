// cuBLAS, opened at run time (dlopen) instead of linked: libcublasLt carries ~94 KiB of static
// TLS, which, linked into every binary, leaves no room for the small thread stacks some
// libraries use (civetweb's, under kilnd's /metrics) and makes CPU-only machines need cuBLAS.
#pragma once

#include <cublas_v2.h>

#include "absl/status/statusor.h"

namespace kiln {

// The cuBLAS entry points kiln calls, resolved once from libcublas.so.13 (or libcublas.so, whose
// major version is checked against the headers kiln was compiled with).
struct CublasLibrary {
  decltype(&cublasGetProperty) GetProperty;
  decltype(&cublasCreate_v2) Create;
  decltype(&cublasDestroy_v2) Destroy;
  decltype(&cublasSetStream_v2) SetStream;
  decltype(&cublasSetMathMode) SetMathMode;
  decltype(&cublasGetVersion_v2) GetVersion;
  decltype(&cublasSgemm_v2) Sgemm;
  decltype(&cublasSgemmStridedBatched) SgemmStridedBatched;
  // float32 operands with a compute type (CUBLAS_COMPUTE_32F_FAST_16BF: bfloat16 products). The
  // C entry points: C++ sees overloads of these names (a deprecated cudaDataType compute type).
  cublasStatus_t (*GemmEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                           const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                           int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                           cublasGemmAlgo_t);
  cublasStatus_t (*GemmStridedBatchedEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                         int, int, const void*, const void*, cudaDataType, int,
                                         long long, const void*, cudaDataType, int,  // NOLINT
                                         long long, const void*, void*, cudaDataType, int,  // NOLINT
                                         long long, int, cublasComputeType_t,  // NOLINT
                                         cublasGemmAlgo_t);
  decltype(&cublasGetStatusName) GetStatusName;
  decltype(&cublasGetStatusString) GetStatusString;
};

// The library, loaded on first use; thread-safe. FailedPrecondition naming what is missing.
absl::StatusOr<const CublasLibrary*> Cublas();

}  // namespace kiln
