#include "engine/cuda/cublas_library.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/cuda/shared_library.h"

namespace kiln {

namespace {

using cuda_internal::ResolveSymbol;

absl::StatusOr<CublasLibrary> Load() {
  KILN_ASSIGN_OR_RETURN(
      const cuda_internal::OpenedLibrary so,
      cuda_internal::OpenLibrary(
          "cuBLAS", {absl::StrCat("libcublas.so.", CUBLAS_VER_MAJOR), "libcublas.so"}));
  CublasLibrary lib;
  std::string missing;
  ResolveSymbol(so, "cublasGetProperty", &lib.GetProperty, &missing);
  ResolveSymbol(so, "cublasCreate_v2", &lib.Create, &missing);
  ResolveSymbol(so, "cublasDestroy_v2", &lib.Destroy, &missing);
  ResolveSymbol(so, "cublasSetStream_v2", &lib.SetStream, &missing);
  ResolveSymbol(so, "cublasSetMathMode", &lib.SetMathMode, &missing);
  ResolveSymbol(so, "cublasGetVersion_v2", &lib.GetVersion, &missing);
  ResolveSymbol(so, "cublasSgemm_v2", &lib.Sgemm, &missing);
  ResolveSymbol(so, "cublasSgemmStridedBatched", &lib.SgemmStridedBatched, &missing);
  ResolveSymbol(so, "cublasGemmEx", &lib.GemmEx, &missing);
  ResolveSymbol(so, "cublasGemmStridedBatchedEx", &lib.GemmStridedBatchedEx, &missing);
  ResolveSymbol(so, "cublasGetStatusName", &lib.GetStatusName, &missing);
  ResolveSymbol(so, "cublasGetStatusString", &lib.GetStatusString, &missing);
  if (lib.GetProperty == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuBLAS at ", so.path, " lacks cublasGetProperty: not cuBLAS ", CUBLAS_VER_MAJOR));
  }
  int major = -1;
  if (lib.GetProperty(MAJOR_VERSION, &major) != CUBLAS_STATUS_SUCCESS) major = -1;
  KILN_RETURN_IF_ERROR(
      cuda_internal::CheckMajorVersion("cuBLAS", so.path, major, CUBLAS_VER_MAJOR));
  if (!missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("cuBLAS at ", so.path, " lacks ", missing));
  }
  return lib;
}

}  // namespace

absl::StatusOr<const CublasLibrary*> Cublas() {
  // Loaded once; the handle stays open for the life of the process.
  static const absl::StatusOr<CublasLibrary>* const loaded =
      new absl::StatusOr<CublasLibrary>(Load());
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

}  // namespace kiln
