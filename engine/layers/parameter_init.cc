#include "engine/layers/parameter_init.h"

#include <cmath>
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

absl::Status InitNormalParameter(Backend* backend, const char* name, const Shape& shape, float std,
                                 Rng* rng, Parameter* param) {
  param->name = name;
  KILN_ASSIGN_OR_RETURN(param->value, backend->Allocate(DType::kF32, shape));
  KILN_ASSIGN_OR_RETURN(param->grad, backend->Allocate(DType::kF32, shape));
  return FillNormal(backend, std, rng, &param->value);
}

absl::Status FillNormal(Backend* backend, float std, Rng* rng, Tensor* value) {
  std::vector<float> host(value->numel());
  constexpr double kTwoPi = 6.283185307179586;
  for (size_t i = 0; i < host.size(); i += 2) {
    const double radius = std::sqrt(-2.0 * std::log(1.0 - rng->Uniform()));  // 1 - u is in (0, 1]
    const double angle = kTwoPi * rng->Uniform();
    host[i] = static_cast<float>(std * radius * std::cos(angle));
    if (i + 1 < host.size()) host[i + 1] = static_cast<float>(std * radius * std::sin(angle));
  }
  return backend->CopyFromHost(host.data(), host.size() * sizeof(float), value);
}

}  // namespace kiln
