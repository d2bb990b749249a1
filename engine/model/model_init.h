// Model-wide initialisation rules (ModelConfig::init), applied once the layers have drawn their
// own (PyTorch's module defaults).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"

namespace kiln {

// Redraws `params` (a model's, in its order) under `rule` from its own stream of `seed`, so the
// same seed gives the same weights on every backend. kDefault changes nothing. `n_layer` scales
// kGpt2's residual projections (InitRule's comment).
absl::Status ApplyInitRule(InitRule rule, int64_t n_layer, uint64_t seed, Backend* backend,
                           const std::vector<NamedParameter>& params);

}  // namespace kiln
