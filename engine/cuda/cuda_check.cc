#include "engine/cuda/cuda_check.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cublas_library.h"
#include "engine/cuda/cudnn_library.h"

namespace kiln::cuda_internal {

namespace {

// __FILE__ is absolute in CMake builds: keep it from "engine/" on.
const char* ShortFile(const char* file) {
  const char* p = std::strstr(file, "engine/");
  return p != nullptr ? p : file;
}

absl::Status Make(bool out_of_memory, const char* call, const char* file, int line,
                  const std::string& what) {
  std::string message = absl::StrCat(call, " failed at ", ShortFile(file), ":", line, ": ", what);
  if (out_of_memory) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

}  // namespace

absl::Status CallError(cudaError_t rc, const char* call, const char* file, int line) {
  // Clears the runtime's record of a non-sticky error, so the next launch check does not report
  // this failure a second time. Sticky errors (a faulted kernel) stay with the context.
  cudaGetLastError();
  return Make(rc == cudaErrorMemoryAllocation, call, file, line,
              absl::StrCat(cudaGetErrorName(rc), ": ", cudaGetErrorString(rc)));
}

namespace {
// cuBLAS's own names for a status, when the library is loaded (it is, once a handle exists).
std::string CublasMessage(cublasStatus_t rc) {
  auto lib = Cublas();
  if (!lib.ok()) return absl::StrCat("cuBLAS status ", static_cast<int>(rc));
  return absl::StrCat((*lib)->GetStatusName(rc), ": ", (*lib)->GetStatusString(rc));
}
}  // namespace

absl::Status CallError(cublasStatus_t rc, const char* call, const char* file, int line) {
  return Make(rc == CUBLAS_STATUS_ALLOC_FAILED, call, file, line, CublasMessage(rc));
}

absl::Status CallError(cudnnStatus_t rc, const char* call, const char* file, int line) {
  const bool oom = rc == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
                   rc == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED;
  std::string what = absl::StrCat("cuDNN status ", static_cast<int>(rc));
  // cuDNN's own words, when the library is loaded (it is, once a handle exists).
  if (auto lib = Cudnn(); lib.ok()) {
    char detail[512] = {0};
    (*lib)->GetLastErrorString(detail, sizeof(detail));
    absl::StrAppend(&what, ": ", (*lib)->GetErrorString(rc));
    if (detail[0] != '\0') absl::StrAppend(&what, " (", detail, ")");
  }
  return Make(oom, call, file, line, what);
}

absl::Status Annotate(absl::Status s, const std::string& context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

}  // namespace kiln::cuda_internal
