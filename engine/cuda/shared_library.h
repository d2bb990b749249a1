// Opening a CUDA library (cuBLAS, cuDNN) at run time instead of linking it: a CPU-only machine
// runs kilnd without it, and a machine with the wrong major version gets an error that says so
// rather than a crash inside the library.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kiln::cuda_internal {

// A library opened with dlopen, kept open for the life of the process.
struct OpenedLibrary {
  void* handle = nullptr;
  std::string path;  // the file the loader found (dlinfo), for messages
};

// The first of `names` that dlopen can open. FailedPrecondition "cannot load <what>: <each
// dlerror>" when none can.
absl::StatusOr<OpenedLibrary> OpenLibrary(const std::string& what,
                                          const std::vector<std::string>& names);

// Resolves `symbol` into `*fn`; appends the symbol's name to `*missing` when it is absent.
template <typename Fn>
void ResolveSymbol(const OpenedLibrary& lib, const char* symbol, Fn* fn, std::string* missing);

// OK when `found_major` is `want_major`; FailedPrecondition otherwise, naming the library, the
// file it came from and both versions. The unversioned file name (libcublas.so) may point at
// another major version than the one kiln was compiled against.
absl::Status CheckMajorVersion(const std::string& what, const std::string& path, int found_major,
                               int want_major);

// --- implementation -----------------------------------------------------------------------------

void* LookUpSymbol(const OpenedLibrary& lib, const char* symbol);

template <typename Fn>
void ResolveSymbol(const OpenedLibrary& lib, const char* symbol, Fn* fn, std::string* missing) {
  *fn = reinterpret_cast<Fn>(LookUpSymbol(lib, symbol));
  if (*fn == nullptr) {
    if (!missing->empty()) missing->append(", ");
    missing->append(symbol);
  }
}

}  // namespace kiln::cuda_internal
