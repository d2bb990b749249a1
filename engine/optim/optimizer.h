// Optimizers over a model's parameters, with PyTorch's update formulas, and their state for
// checkpoints.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/model/model.h"
#include "engine/optim/optimizer_config.h"

namespace kiln {

// One state tensor of the optimizer, named "<parameter>.<slot>" ("0.weight.exp_avg").
struct NamedState {
  std::string name;
  Tensor* tensor;
};

class Optimizer {
 public:
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(const OptimizerConfig& config,
                                                           Backend* backend,
                                                           std::vector<NamedParameter> params);
  virtual ~Optimizer() = default;

  // Applies one update with learning rate lr to every parameter from its gradient.
  virtual absl::Status Step(float lr) = 0;
  // The momentum (SGD) or beta1 (Adam) of the steps that follow, in place of the configured one,
  // for schedules that cycle it (OneCycle) as PyTorch's do by rewriting the param group.
  void set_momentum(float momentum) { momentum_override_ = momentum; }
  virtual std::vector<NamedState> state() = 0;

  // Updates applied so far (PyTorch's "step" in the optimizer state).
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }

 protected:
  Optimizer(const OptimizerConfig& config, Backend* backend, std::vector<NamedParameter> params)
      : config_(config), backend_(backend), params_(std::move(params)) {}
  // One zero state tensor per parameter, shaped like it.
  absl::StatusOr<std::vector<Tensor>> ZeroSlots();
  // The weight decay of parameter i under the config's DecayRule: weight_decay, or 0 for a
  // parameter of fewer than 2 dimensions under kMatrices.
  float WeightDecayOf(size_t i) const;

  OptimizerConfig config_;
  Backend* backend_;
  std::vector<NamedParameter> params_;
  int64_t steps_ = 0;
  std::optional<float> momentum_override_;
};

}  // namespace kiln
