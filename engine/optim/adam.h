// Adam (L2 weight decay in the gradient) and AdamW (decoupled decay), as torch.optim.Adam/AdamW.
#pragma once

#include "engine/optim/optimizer.h"

namespace kiln {

class Adam final : public Optimizer {
 public:
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(const OptimizerConfig& config,
                                                           Backend* backend,
                                                           std::vector<NamedParameter> params);
  absl::Status Step(float lr) override;
  std::vector<NamedState> state() override;

 private:
  using Optimizer::Optimizer;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
};

}  // namespace kiln
