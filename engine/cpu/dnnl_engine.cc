#include "engine/cpu/dnnl_engine.h"

#include "absl/strings/str_cat.h"

namespace kiln::cpu_internal {

const dnnl::engine& DnnlEngine() {
  static const dnnl::engine* const engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

absl::Status DnnlError(const char* what, const dnnl::error& e) {
  const std::string message = absl::StrCat(what, ": oneDNN: ", e.what());
  if (e.status == dnnl_out_of_memory) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

}  // namespace kiln::cpu_internal
