#include "engine/reference_configs.h"

namespace kiln {

TrainConfig MnistMlpReference() {
  TrainConfig c;
  c.model = MnistMlpConfig();
  c.optimizer.kind = OptimizerConfig::Kind::kSgd;
  c.optimizer.lr = 0.001f;
  c.optimizer.momentum = 0.9f;
  c.batch_size = 128;
  c.norm = {1.0f / 255.0f, 0.5f, 0.5f};  // ToTensor, then Normalize((0.5,), (0.5,))
  return c;
}

TrainConfig MnistCnnReference() {
  TrainConfig c;
  c.model = MnistCnnConfig();
  c.optimizer.kind = OptimizerConfig::Kind::kAdam;
  c.optimizer.lr = 1e-3f;
  c.batch_size = 64;
  c.norm = {1.0f / 255.0f, 0.0f, 1.0f};  // ToTensor
  return c;
}

}  // namespace kiln
