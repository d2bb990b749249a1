// Where a training run stands: what a checkpoint records so that a resumed run continues exactly.
#pragma once

#include <cstdint>

#include "engine/rng.h"

namespace kiln {

struct TrainingPosition {
  int epochs_done = 0;
  int step_in_epoch = 0;  // batches of epoch epochs_done+1 already trained
  int64_t global_step = 0;
  Rng::State epoch_rng{};  // shuffle RNG as it was at the start of the current epoch
  // Sums over the current epoch's trained batches, so a resumed epoch reports the whole epoch.
  double epoch_loss_sum = 0;
  int64_t epoch_correct = 0, epoch_samples = 0;
  double epoch_seconds = 0;
};

}  // namespace kiln
