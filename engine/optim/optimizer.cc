#include "engine/optim/optimizer.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/optim/adam.h"
#include "engine/optim/sgd.h"

namespace kiln {

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const OptimizerConfig& config,
                                                             Backend* backend,
                                                             std::vector<NamedParameter> params) {
  if (!(config.lr >= 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer lr must be >= 0, got ", config.lr));
  }
  if (!(config.weight_decay >= 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer weight_decay must be >= 0, got ", config.weight_decay));
  }
  switch (config.kind) {
    case OptimizerConfig::Kind::kSgd:
      return Sgd::Create(config, backend, std::move(params));
    case OptimizerConfig::Kind::kAdam:
    case OptimizerConfig::Kind::kAdamW:
      return Adam::Create(config, backend, std::move(params));
  }
  return absl::InvalidArgumentError("unknown optimizer kind");
}

absl::StatusOr<std::vector<Tensor>> Optimizer::ZeroSlots() {
  std::vector<Tensor> slots;
  for (const NamedParameter& p : params_) {
    KILN_ASSIGN_OR_RETURN(Tensor t, backend_->Allocate(DType::kF32, p.param->value.shape()));
    slots.push_back(std::move(t));
  }
  return slots;
}

float Optimizer::WeightDecayOf(size_t i) const {
  if (config_.decay_rule == OptimizerConfig::DecayRule::kMatrices &&
      params_[i].param->value.rank() < 2) {
    return 0.0f;
  }
  return config_.weight_decay;
}

}  // namespace kiln
