#include "engine/model/model_init.h"

#include <cmath>

#include "absl/strings/match.h"
#include "common/status_macros.h"
#include "engine/layers/parameter_init.h"
#include "engine/rng.h"

namespace kiln {

namespace {
// Keeps the rule's draws apart from the layers' stream of the same seed.
constexpr uint64_t kInitRuleStream = 0x6E72C0DE;
constexpr float kGpt2Std = 0.02f;
}  // namespace

absl::Status ApplyInitRule(InitRule rule, int64_t n_layer, uint64_t seed, Backend* backend,
                           const std::vector<NamedParameter>& params) {
  if (rule == InitRule::kDefault) return absl::OkStatus();
  Rng rng(seed ^ kInitRuleStream);
  // nanoGPT's model.py: apply(_init_weights), then c_proj.weight at 0.02 / sqrt(2 n_layer).
  const float residual_std =
      kGpt2Std /
      static_cast<float>(std::sqrt(2.0 * static_cast<double>(std::max<int64_t>(n_layer, 1))));
  for (const NamedParameter& p : params) {
    Tensor& value = p.param->value;
    if (absl::EndsWith(p.name, "bias")) {
      KILN_RETURN_IF_ERROR(backend->Fill(&value, 0.0f));
    } else if (value.shape().size() >= 2) {
      const float std = absl::EndsWith(p.name, "c_proj.weight") ? residual_std : kGpt2Std;
      KILN_RETURN_IF_ERROR(FillNormal(backend, std, &rng, &value));
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln
