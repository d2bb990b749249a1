// NCCL, opened at run time (dlopen) like cuBLAS and cuDNN instead of linked, so that binaries
// start on machines without it and only a job that asks for NCCL needs libnccl.so.2.
#pragma once

#include <nccl.h>

#include "absl/status/statusor.h"

namespace kiln {

// The NCCL entry points kiln calls, resolved once from libnccl.so.2 (or libnccl.so, whose major
// version is checked against the header kiln was compiled with).
struct NcclLibrary {
  decltype(&ncclGetVersion) GetVersion;
  decltype(&ncclGetUniqueId) GetUniqueId;
  decltype(&ncclCommInitRankConfig) CommInitRankConfig;
  decltype(&ncclCommGetAsyncError) CommGetAsyncError;
  decltype(&ncclCommFinalize) CommFinalize;
  decltype(&ncclCommAbort) CommAbort;
  decltype(&ncclCommDestroy) CommDestroy;
  decltype(&ncclAllReduce) AllReduce;
  decltype(&ncclBroadcast) Broadcast;
  decltype(&ncclGetErrorString) GetErrorString;
  decltype(&ncclGetLastError) GetLastError;
};

// The library, loaded on first use; thread-safe. FailedPrecondition naming what is missing.
absl::StatusOr<const NcclLibrary*> Nccl();

}  // namespace kiln
