// oneDNN's process-wide CPU engine, and its exceptions as statuses. Internal to engine/cpu/.
//
// Debian's oneDNN runs on OpenMP (DNNL_CPU_RUNTIME_OMP): a primitive takes its team size from the
// calling thread's omp_get_max_threads(), which CpuBackend::BindCallingThread sets, so oneDNN,
// OpenBLAS and our own loops share libgomp's one pool and never oversubscribe the cores.
#pragma once

#include "absl/status/status.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace kiln::cpu_internal {

// The CPU engine every cached primitive is created on (creating one per backend costs nothing
// more, but primitives then could not be shared by the memory planner's dry runs).
const dnnl::engine& DnnlEngine();

// A oneDNN exception as a status: out of memory as ResourceExhausted, anything else (an
// unsupported shape) as Internal, both naming `what`.
absl::Status DnnlError(const char* what, const dnnl::error& e);

// Primitive caches keep at most this many shapes and start over when full: serving's dynamic
// batches can bring every batch size up to its limit, and a primitive descriptor holds its
// kernel's generated code (tens of KB).
inline constexpr size_t kMaxCachedShapes = 64;

}  // namespace kiln::cpu_internal
