#include "engine/cuda/cublas_library.h"

#include <dlfcn.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace kiln {

namespace {

absl::StatusOr<CublasLibrary> Load() {
  void* handle = nullptr;
  std::string tried;
  for (const char* name : {"libcublas.so.13", "libcublas.so"}) {
    handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) break;
    absl::StrAppend(&tried, tried.empty() ? "" : "; ", dlerror());
  }
  if (handle == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("cannot load cuBLAS: ", tried));
  }
  CublasLibrary lib;
  std::string missing;
  auto resolve = [&](auto* fn, const char* symbol) {
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(handle, symbol));
    if (*fn == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", symbol);
  };
  resolve(&lib.Create, "cublasCreate_v2");
  resolve(&lib.Destroy, "cublasDestroy_v2");
  resolve(&lib.SetStream, "cublasSetStream_v2");
  resolve(&lib.SetMathMode, "cublasSetMathMode");
  resolve(&lib.GetVersion, "cublasGetVersion_v2");
  resolve(&lib.Sgemm, "cublasSgemm_v2");
  resolve(&lib.GetStatusName, "cublasGetStatusName");
  resolve(&lib.GetStatusString, "cublasGetStatusString");
  if (!missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("cuBLAS lacks ", missing));
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
