#include "engine/cuda/nccl_library.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/cuda/shared_library.h"

namespace kiln {

namespace {

using cuda_internal::ResolveSymbol;

absl::StatusOr<NcclLibrary> Load() {
  KILN_ASSIGN_OR_RETURN(
      const cuda_internal::OpenedLibrary so,
      cuda_internal::OpenLibrary("NCCL", {absl::StrCat("libnccl.so.", NCCL_MAJOR), "libnccl.so"}));
  NcclLibrary lib;
  std::string missing;
  ResolveSymbol(so, "ncclGetVersion", &lib.GetVersion, &missing);
  ResolveSymbol(so, "ncclGetUniqueId", &lib.GetUniqueId, &missing);
  ResolveSymbol(so, "ncclCommInitRankConfig", &lib.CommInitRankConfig, &missing);
  ResolveSymbol(so, "ncclCommGetAsyncError", &lib.CommGetAsyncError, &missing);
  ResolveSymbol(so, "ncclCommFinalize", &lib.CommFinalize, &missing);
  ResolveSymbol(so, "ncclCommAbort", &lib.CommAbort, &missing);
  ResolveSymbol(so, "ncclCommDestroy", &lib.CommDestroy, &missing);
  ResolveSymbol(so, "ncclAllReduce", &lib.AllReduce, &missing);
  ResolveSymbol(so, "ncclBroadcast", &lib.Broadcast, &missing);
  ResolveSymbol(so, "ncclGetErrorString", &lib.GetErrorString, &missing);
  ResolveSymbol(so, "ncclGetLastError", &lib.GetLastError, &missing);
  if (lib.GetVersion == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("NCCL at ", so.path, " lacks ncclGetVersion: not NCCL ", NCCL_MAJOR));
  }
  int version = 0;
  if (lib.GetVersion(&version) != ncclSuccess) version = -1;
  // NCCL_VERSION(X,Y,Z) is X*10000 + Y*100 + Z since 2.9.
  KILN_RETURN_IF_ERROR(cuda_internal::CheckMajorVersion(
      "NCCL", so.path, version < 0 ? -1 : version / 10000, NCCL_MAJOR));
  if (!missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("NCCL at ", so.path, " lacks ", missing));
  }
  return lib;
}

}  // namespace

absl::StatusOr<const NcclLibrary*> Nccl() {
  // Loaded once; the handle stays open for the life of the process.
  static const absl::StatusOr<NcclLibrary>* const loaded = new absl::StatusOr<NcclLibrary>(Load());
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

}  // namespace kiln
