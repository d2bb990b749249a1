#include "engine/layers/parameter_init.h"

#include <vector>

#include "common/status_macros.h"

namespace kiln {

absl::Status InitUniformParameter(Backend* backend, const char* name, const Shape& shape,
                                  float bound, Rng* rng, Parameter* param) {
  param->name = name;
  KILN_ASSIGN_OR_RETURN(param->value, backend->Allocate(DType::kF32, shape));
  KILN_ASSIGN_OR_RETURN(param->grad, backend->Allocate(DType::kF32, shape));
  std::vector<float> host(param->value.numel());
  for (float& v : host) v = rng->Uniform(-bound, bound);
  return backend->CopyFromHost(host.data(), host.size() * sizeof(float), &param->value);
}

}  // namespace kiln
