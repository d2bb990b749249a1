// SGD with momentum, dampening, Nesterov and L2 weight decay (torch.optim.SGD).
#pragma once

#include "engine/optim/optimizer.h"

namespace kiln {

class Sgd final : public Optimizer {
 public:
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(const OptimizerConfig& config,
                                                           Backend* backend,
                                                           std::vector<NamedParameter> params);
  absl::Status Step(float lr) override;
  std::vector<NamedState> state() override;

 private:
  using Optimizer::Optimizer;
  std::vector<Tensor> momentum_;  // empty when momentum == 0
};

}  // namespace kiln
