// Learning rate for an epoch under a schedule (PyTorch's StepLR and CosineAnnealingLR, stepped
// once per epoch).
#pragma once

#include "absl/status/status.h"
#include "engine/optim/optimizer_config.h"

namespace kiln {

// lr during 0-based `epoch` of a run of `total_epochs`.
float ScheduledLearningRate(float base_lr, const LrScheduleConfig& schedule, int epoch,
                            int total_epochs);

absl::Status ValidateSchedule(const LrScheduleConfig& schedule);

}  // namespace kiln
