#include "engine/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"

namespace kiln {

namespace {

// PyTorch's OneCycleLR._annealing_cos and _annealing_linear, pct in [0, 1].
double Anneal(LrScheduleConfig::Anneal how, double start, double end, double pct) {
  if (how == LrScheduleConfig::Anneal::kLinear) return (end - start) * pct + start;
  return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1.0);
}

// OneCycleLR.get_lr: two phases ending at steps pct_start * total - 1 and total - 1; a step past
// the end stays in the last phase, extrapolated as PyTorch would not allow (it raises).
ScheduledRates OneCycle(float max_lr, const LrScheduleConfig& s, const SchedulePoint& p) {
  const double total = p.TotalSteps();
  const double initial_lr = max_lr / s.div_factor;
  const double min_lr = initial_lr / s.final_div_factor;
  const double step = std::min<double>(static_cast<double>(p.step), total - 1);
  const double phase1_end = s.pct_start * total - 1;
  double lr, momentum;
  if (step <= phase1_end) {
    const double pct = phase1_end > 0 ? step / phase1_end : 1.0;
    lr = Anneal(s.anneal, initial_lr, max_lr, pct);
    momentum = Anneal(s.anneal, s.max_momentum, s.base_momentum, pct);
  } else {
    const double span = (total - 1) - phase1_end;
    const double pct = span > 0 ? (step - phase1_end) / span : 1.0;
    lr = Anneal(s.anneal, max_lr, min_lr, pct);
    momentum = Anneal(s.anneal, s.base_momentum, s.max_momentum, pct);
  }
  ScheduledRates r;
  r.lr = static_cast<float>(lr);
  if (s.cycle_momentum) r.momentum = static_cast<float>(momentum);
  return r;
}

// nanoGPT's get_lr(it): linear warm-up to lr over warmup_iters steps, then half a cosine down to
// eta_min (min_lr) by lr_decay_iters (0: the run's last step), eta_min after.
float WarmupCosine(float lr, const LrScheduleConfig& s, const SchedulePoint& p) {
  const double it = static_cast<double>(p.step);
  const double warmup = static_cast<double>(s.warmup_iters);
  if (it < warmup) return static_cast<float>(double{lr} * (it + 1.0) / (warmup + 1.0));
  const double decay_iters =
      s.lr_decay_iters > 0 ? static_cast<double>(s.lr_decay_iters) : p.TotalSteps();
  const double ratio = (it - warmup) / std::max(1.0, decay_iters - warmup);
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * std::min(1.0, ratio)));
  return static_cast<float>(s.eta_min + coeff * (double{lr} - s.eta_min));
}

absl::Status ValidateWarmupCosine(const LrScheduleConfig& s, float base_lr) {
  if (s.warmup_iters < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule warmup_iters must be >= 0, got ", s.warmup_iters));
  }
  if (s.lr_decay_iters < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule lr_decay_iters must be >= 0 (0: the run's steps), got ", s.lr_decay_iters));
  }
  if (s.lr_decay_iters > 0 && s.lr_decay_iters < s.warmup_iters) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule lr_decay_iters (", s.lr_decay_iters,
                     ") must be 0 (the run's steps) or >= warmup_iters (", s.warmup_iters, ")"));
  }
  if (!(s.eta_min >= 0.0f && s.eta_min <= base_lr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule min_lr (eta_min) must be in [0, lr = ", base_lr, "], got ", s.eta_min));
  }
  return absl::OkStatus();
}

}  // namespace

ScheduledRates ScheduledRatesAt(float base_lr, const LrScheduleConfig& s,
                                const SchedulePoint& point) {
  if (s.kind == LrScheduleConfig::Kind::kOneCycle) return OneCycle(base_lr, s, point);
  ScheduledRates r;
  if (s.kind == LrScheduleConfig::Kind::kWarmupCosine) {
    r.lr = WarmupCosine(base_lr, s, point);
    return r;
  }
  r.lr = ScheduledLearningRate(base_lr, s, point.epoch, point.total_epochs);
  return r;
}

float ScheduledLearningRate(float base_lr, const LrScheduleConfig& s, int epoch, int total_epochs) {
  switch (s.kind) {
    case LrScheduleConfig::Kind::kOneCycle:
      // Per step only (ScheduledRatesAt); per epoch, the rate at the epoch's first step of one.
      return OneCycle(base_lr, s, {epoch, total_epochs, epoch, 1}).lr;
    case LrScheduleConfig::Kind::kWarmupCosine:
      return WarmupCosine(base_lr, s, {epoch, total_epochs, epoch, 1});
    case LrScheduleConfig::Kind::kConstant:
      return base_lr;
    case LrScheduleConfig::Kind::kStep:
      return base_lr * std::pow(s.gamma, static_cast<float>(epoch / s.step_size));
    case LrScheduleConfig::Kind::kCosine: {
      const double t_max = s.t_max > 0 ? s.t_max : total_epochs;
      const double cos = std::cos(std::numbers::pi * static_cast<double>(epoch) / t_max);
      return static_cast<float>(s.eta_min + (base_lr - s.eta_min) * (1.0 + cos) / 2.0);
    }
  }
  return base_lr;
}

absl::Status ValidateSchedule(const LrScheduleConfig& s, float base_lr) {
  if (s.kind == LrScheduleConfig::Kind::kWarmupCosine) return ValidateWarmupCosine(s, base_lr);
  if (s.kind == LrScheduleConfig::Kind::kStep && s.step_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule step_size must be positive, got ", s.step_size));
  }
  if (s.kind == LrScheduleConfig::Kind::kStep && !(s.gamma > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("schedule gamma must be > 0, got ", s.gamma));
  }
  if (s.kind == LrScheduleConfig::Kind::kCosine && (s.t_max < 0 || !(s.eta_min >= 0.0f))) {
    return absl::InvalidArgumentError("schedule t_max and eta_min must be >= 0");
  }
  if (s.kind == LrScheduleConfig::Kind::kOneCycle) {
    if (!(s.pct_start > 0.0f && s.pct_start < 1.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedule pct_start must be in (0, 1), got ", s.pct_start));
    }
    if (!(s.div_factor >= 1.0f) || !(s.final_div_factor >= 1.0f) || !std::isfinite(s.div_factor) ||
        !std::isfinite(s.final_div_factor)) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedule div_factor and final_div_factor must be finite and >= 1, got ",
                       s.div_factor, " and ", s.final_div_factor));
    }
    if (s.cycle_momentum &&
        !(s.base_momentum >= 0.0f && s.base_momentum <= s.max_momentum && s.max_momentum < 1.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedule momentum needs 0 <= base_momentum <= max_momentum < 1, got ",
                       s.base_momentum, " and ", s.max_momentum));
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln
