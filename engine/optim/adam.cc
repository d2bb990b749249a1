#include "engine/optim/adam.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kiln {

absl::StatusOr<std::unique_ptr<Optimizer>> Adam::Create(const OptimizerConfig& config,
                                                        Backend* backend,
                                                        std::vector<NamedParameter> params) {
  auto in_unit = [](float b) { return b >= 0.0f && b < 1.0f; };
  if (!in_unit(config.beta1) || !in_unit(config.beta2)) {
    return absl::InvalidArgumentError(
        absl::StrCat("adam betas must be in [0, 1), got ", config.beta1, ", ", config.beta2));
  }
  if (!(config.eps > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("adam eps must be > 0, got ", config.eps));
  }
  auto adam = std::unique_ptr<Adam>(new Adam(config, backend, std::move(params)));
  KILN_ASSIGN_OR_RETURN(adam->exp_avg_, adam->ZeroSlots());
  KILN_ASSIGN_OR_RETURN(adam->exp_avg_sq_, adam->ZeroSlots());
  return std::unique_ptr<Optimizer>(std::move(adam));
}

absl::Status Adam::Step(float lr) {
  ++steps_;
  AdamHyper h;
  h.lr = lr;
  h.beta1 = momentum_override_.value_or(config_.beta1);
  h.beta2 = config_.beta2;
  h.eps = config_.eps;
  h.decay = config_.kind == OptimizerConfig::Kind::kAdamW ? WeightDecayMode::kDecoupled
                                                          : WeightDecayMode::kL2;
  h.step = steps_;
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter* p = params_[i].param;
    h.weight_decay = WeightDecayOf(i);
    KILN_RETURN_IF_ERROR(backend_->AdamUpdate(p->value.numel(), h, p->value.f32(), p->grad.f32(),
                                              exp_avg_[i].f32(), exp_avg_sq_[i].f32()));
  }
  return absl::OkStatus();
}

std::vector<NamedState> Adam::state() {
  std::vector<NamedState> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.push_back({params_[i].name + ".exp_avg", &exp_avg_[i]});
    out.push_back({params_[i].name + ".exp_avg_sq", &exp_avg_sq_[i]});
  }
  return out;
}

}  // namespace kiln
