// What a training job or a served model will allocate, counted from the model's shapes before
// anything is: parameters and their gradients, optimizer state, activations and their gradients,
// each layer's own buffers, the convolution workspace (per thread on the CPU), the batch and
// dataset buffers. kilnd refuses at SubmitJob and at deploy what does not fit its limit, instead
// of finding out from a failed allocation halfway through (or from the kernel's OOM killer).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/byte_size.h"
#include "engine/backend.h"
#include "engine/model/model_config.h"
#include "engine/trainer.h"

namespace kiln {

struct MemoryNeed {
  int layer = -1;    // the model layer that needs it; -1 for the model or the job as a whole
  std::string what;  // "conv2d workspace", "parameters and gradients", ...
  int64_t bytes = 0;
  // "layer 0 conv2d workspace: 8.2 GiB" or "optimizer state: 2.0 MiB".
  std::string Describe() const;
};

struct MemoryPlan {
  std::vector<MemoryNeed> needs;
  int64_t total_bytes() const;        // saturating at INT64_MAX
  const MemoryNeed& largest() const;  // needs is never empty
};

// Where the job runs: the device kind and, on the CPU, its thread count (the im2col workspace
// is per thread) and precision (bf16 convolutions stage bfloat16 copies of their operands).
struct MemoryTarget {
  DeviceKind device = DeviceKind::kCpu;
  int threads = 1;
  Precision precision = Precision::kFp32;
};

// A training job on `train_samples` (and `test_samples`) samples of the model's input shape; for
// a token run (config.max_iters > 0) the splits' token counts, whose shards stay mapped and count
// nothing but a batch's windows.
// InvalidArgument when the model's shapes do not check out (InferShapes).
absl::StatusOr<MemoryPlan> PlanTrainingMemory(const TrainConfig& config, int64_t train_samples,
                                              int64_t test_samples, const MemoryTarget& target);

// A served model answering batches of up to `max_batch` samples.
absl::StatusOr<MemoryPlan> PlanInferenceMemory(const ModelConfig& model, int max_batch,
                                               const MemoryTarget& target);

}  // namespace kiln
