#include "engine/cuda/shared_library.h"

#include <dlfcn.h>
#include <link.h>

#include "absl/strings/str_cat.h"

namespace kiln::cuda_internal {

absl::StatusOr<OpenedLibrary> OpenLibrary(const std::string& what,
                                          const std::vector<std::string>& names) {
  std::string tried;
  for (const std::string& name : names) {
    void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      absl::StrAppend(&tried, tried.empty() ? "" : "; ", dlerror());
      continue;
    }
    OpenedLibrary lib{handle, name};
    const link_map* map = nullptr;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
        map->l_name[0] != '\0') {
      lib.path = map->l_name;
    }
    return lib;
  }
  return absl::FailedPreconditionError(absl::StrCat("cannot load ", what, ": ", tried));
}

void* LookUpSymbol(const OpenedLibrary& lib, const char* symbol) {
  return dlsym(lib.handle, symbol);
}

absl::Status CheckMajorVersion(const std::string& what, const std::string& path, int found_major,
                               int want_major) {
  if (found_major == want_major) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(what, " ", found_major, " found at ", path,
                                                    ", but this build of kiln needs ", what, " ",
                                                    want_major));
}

}  // namespace kiln::cuda_internal
