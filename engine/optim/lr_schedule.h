// Learning rate (and momentum, where the schedule cycles it) for a step under a schedule:
// PyTorch's StepLR and CosineAnnealingLR stepped once per epoch, OneCycleLR and nanoGPT's
// warm-up-then-cosine get_lr once per batch.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "engine/optim/optimizer_config.h"

namespace kiln {

// Where a step sits in its run.
struct SchedulePoint {
  int epoch = 0;  // 0-based
  int total_epochs = 1;
  int64_t step = 0;  // 0-based across the run
  int64_t steps_per_epoch = 1;
  // The run's steps when its last epoch is shorter (a token run's max_iters); 0 means
  // steps_per_epoch * total_epochs.
  int64_t total_steps = 0;
  double TotalSteps() const {
    return total_steps > 0 ? static_cast<double>(total_steps)
                           : static_cast<double>(steps_per_epoch) * total_epochs;
  }
};

struct ScheduledRates {
  float lr = 0;
  std::optional<float> momentum;  // set only by a schedule that cycles it (OneCycle)
};

// The rates for the step at `point`; base_lr is the optimizer's lr.
ScheduledRates ScheduledRatesAt(float base_lr, const LrScheduleConfig& schedule,
                                const SchedulePoint& point);

// lr during 0-based `epoch` of a run of `total_epochs`, for the per-epoch schedules.
float ScheduledLearningRate(float base_lr, const LrScheduleConfig& schedule, int epoch,
                            int total_epochs);

// The schedule's fields, for an optimizer whose lr is base_lr (a floor above it is refused).
absl::Status ValidateSchedule(const LrScheduleConfig& schedule, float base_lr);

}  // namespace kiln
