// PyTorch's default initialisation of weights and biases, drawn from our seeded Rng.
#pragma once

#include "absl/status/status.h"
#include "engine/backend.h"
#include "engine/layers/layer.h"
#include "engine/rng.h"

namespace kiln {

// Allocates value and grad of `shape` and fills value uniformly in [-bound, bound]; for
// kaiming-uniform with a=sqrt(5) and for the bias, bound = 1/sqrt(fan_in).
absl::Status InitUniformParameter(Backend* backend, const char* name, const Shape& shape,
                                  float bound, Rng* rng, Parameter* param);

// Allocates value and grad of `shape` and fills value from N(0, std^2) (Box-Muller on the Rng's
// uniforms): GPT-2's and nanoGPT's init of embeddings, std 0.02.
absl::Status InitNormalParameter(Backend* backend, const char* name, const Shape& shape, float std,
                                 Rng* rng, Parameter* param);

// Overwrites an allocated float tensor with draws from N(0, std^2), as InitNormalParameter does.
absl::Status FillNormal(Backend* backend, float std, Rng* rng, Tensor* value);

}  // namespace kiln
