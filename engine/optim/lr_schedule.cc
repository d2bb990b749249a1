#include "engine/optim/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"

namespace kiln {

float ScheduledLearningRate(float base_lr, const LrScheduleConfig& s, int epoch,
                            int total_epochs) {
  switch (s.kind) {
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

absl::Status ValidateSchedule(const LrScheduleConfig& s) {
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
  return absl::OkStatus();
}

}  // namespace kiln
