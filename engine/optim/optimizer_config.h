// Optimizer and learning-rate schedule settings as plain data.
#pragma once

#include <cstdint>

namespace kiln {

struct OptimizerConfig {
  enum class Kind { kSgd, kAdam, kAdamW };
  Kind kind = Kind::kSgd;
  float lr = 1e-3f;
  float weight_decay = 0;
  // SGD
  float momentum = 0, dampening = 0;
  bool nesterov = false;
  // Adam, AdamW
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
};

// kConstant, kStep and kCosine are evaluated once per epoch, as PyTorch's schedulers stepped at
// each epoch's end; kOneCycle once per step, as PyTorch's OneCycleLR stepped after every batch.
struct LrScheduleConfig {
  enum class Kind { kConstant, kStep, kCosine, kOneCycle };
  enum class Anneal { kCos, kLinear };
  Kind kind = Kind::kConstant;
  int64_t step_size = 1;  // kStep: multiply by gamma every step_size epochs
  float gamma = 0.1f;
  int64_t t_max = 0;  // kCosine: period in epochs (0 means the job's epoch count)
  float eta_min = 0;
  // kOneCycle (the optimizer's lr is the peak, PyTorch's max_lr): from lr / div_factor up to lr
  // over the first pct_start of the run's steps, then down to lr / div_factor / final_div_factor.
  // With cycle_momentum, the optimizer's momentum (SGD) or beta1 (Adam) goes the other way,
  // from max_momentum down to base_momentum and back.
  float pct_start = 0.3f;
  Anneal anneal = Anneal::kCos;
  float div_factor = 25.0f;
  float final_div_factor = 1e4f;
  bool cycle_momentum = true;
  float base_momentum = 0.85f, max_momentum = 0.95f;
};

}  // namespace kiln
