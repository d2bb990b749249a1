// Optimizer and learning-rate schedule settings as plain data.
#pragma once

#include <cstdint>

namespace kiln {

struct OptimizerConfig {
  enum class Kind { kSgd, kAdam, kAdamW };
  // Which parameters weight_decay applies to: all of them, or only those of 2 or more dimensions
  // (the weights of linear, convolution and embedding layers; not biases, norms' scales or other
  // 1-D parameters), nanoGPT's rule.
  enum class DecayRule { kAll, kMatrices };
  Kind kind = Kind::kSgd;
  float lr = 1e-3f;
  float weight_decay = 0;
  DecayRule decay_rule = DecayRule::kAll;
  // SGD
  float momentum = 0, dampening = 0;
  bool nesterov = false;
  // Adam, AdamW
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
};

// kConstant, kStep and kCosine are evaluated once per epoch, as PyTorch's schedulers stepped at
// each epoch's end; kOneCycle and kWarmupCosine once per step (iteration), as PyTorch's
// OneCycleLR stepped after every batch and nanoGPT's get_lr(iter).
struct LrScheduleConfig {
  enum class Kind { kConstant, kStep, kCosine, kOneCycle, kWarmupCosine };
  enum class Anneal { kCos, kLinear };
  Kind kind = Kind::kConstant;
  int64_t step_size = 1;  // kStep: multiply by gamma every step_size epochs
  float gamma = 0.1f;
  int64_t t_max = 0;  // kCosine: period in epochs (0 means the job's epoch count)
  float eta_min = 0;  // kCosine's floor, and kWarmupCosine's (nanoGPT's min_lr)
  // kWarmupCosine (nanoGPT's get_lr; the optimizer's lr is the peak): at 0-based step `it`,
  // it < warmup_iters: lr * (it + 1) / (warmup_iters + 1); after, half a cosine from lr down to
  // eta_min over the steps up to lr_decay_iters (0 means the run's total steps), eta_min beyond.
  int64_t warmup_iters = 0;
  int64_t lr_decay_iters = 0;
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
