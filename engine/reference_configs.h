// The mission's two reference workloads as complete training configs (model, optimizer, batch,
// normalisation), so presets, benchmarks and tests share one definition.
#pragma once

#include "engine/trainer.h"

namespace kiln {

// 784-512-256-10 MLP, SGD lr 0.001 momentum 0.9, batch 128, inputs (x/255 - 0.5) / 0.5.
TrainConfig MnistMlpReference();
// conv3x3 32, pool, conv3x3 64, pool, fc 128, fc 10; Adam lr 1e-3, batch 64, inputs x/255.
TrainConfig MnistCnnReference();

}  // namespace kiln
