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

// Evaluated once per epoch, as PyTorch's schedulers stepped at each epoch's end.
struct LrScheduleConfig {
  enum class Kind { kConstant, kStep, kCosine };
  Kind kind = Kind::kConstant;
  int64_t step_size = 1;  // kStep: multiply by gamma every step_size epochs
  float gamma = 0.1f;
  int64_t t_max = 0;      // kCosine: period in epochs (0 means the job's epoch count)
  float eta_min = 0;
};

}  // namespace kiln
