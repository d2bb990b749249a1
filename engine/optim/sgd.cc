#include "engine/optim/sgd.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kiln {

absl::StatusOr<std::unique_ptr<Optimizer>> Sgd::Create(const OptimizerConfig& config,
                                                       Backend* backend,
                                                       std::vector<NamedParameter> params) {
  if (!(config.momentum >= 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sgd momentum must be >= 0, got ", config.momentum));
  }
  if (config.nesterov && (config.momentum <= 0.0f || config.dampening != 0.0f)) {
    return absl::InvalidArgumentError("sgd nesterov needs momentum > 0 and dampening 0");
  }
  auto sgd = std::unique_ptr<Sgd>(new Sgd(config, backend, std::move(params)));
  if (config.momentum != 0.0f) {
    KILN_ASSIGN_OR_RETURN(sgd->momentum_, sgd->ZeroSlots());
  }
  return std::unique_ptr<Optimizer>(std::move(sgd));
}

absl::Status Sgd::Step(float lr) {
  SgdHyper h;
  h.lr = lr;
  h.momentum = momentum_override_.value_or(config_.momentum);
  h.dampening = config_.dampening;
  h.nesterov = config_.nesterov;
  const MomentumBuffer buffer = steps_ == 0 ? MomentumBuffer::kSeed : MomentumBuffer::kAccumulate;
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter* p = params_[i].param;
    h.weight_decay = WeightDecayOf(i);
    KILN_RETURN_IF_ERROR(backend_->SgdUpdate(p->value.numel(), h, buffer, p->value.f32(),
                                             p->grad.f32(),
                                             momentum_.empty() ? nullptr : momentum_[i].f32()));
  }
  ++steps_;
  return absl::OkStatus();
}

std::vector<NamedState> Sgd::state() {
  std::vector<NamedState> out;
  for (size_t i = 0; i < momentum_.size(); ++i) {
    out.push_back({params_[i].name + ".momentum_buffer", &momentum_[i]});
  }
  return out;
}

}  // namespace kiln
