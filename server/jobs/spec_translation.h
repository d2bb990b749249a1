// Turns a JobSpec message into the engine's TrainConfig, applying presets and checking every
// field, with errors that name the field ("spec.model.layers[2].linear.in_features: ...").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/resource_name.h"
#include "engine/tensor.h"
#include "engine/trainer.h"
#include "kiln/v1/model_spec.pb.h"

namespace kiln::server {

// Bounds on what a client may ask for (kilnd's --max_* flags). Breaking a range is
// INVALID_ARGUMENT; a model over the size limits is RESOURCE_EXHAUSTED. Messages name the flag.
struct SpecLimits {
  int max_layers = 64;
  int64_t max_parameters = 50'000'000;
  int64_t max_features = 1'000'000;  // per layer dimension, and the elements of one input sample
  // One batch's activations and their gradients (float32): what training allocates per step.
  int64_t max_activation_bytes = int64_t{8} << 30;
  // Everything one job allocates, host and device together (the engine's memory plan: parameters,
  // optimizer state, activations, workspaces, batches, the dataset). kilnd's default is 3/4 of
  // the machine's memory.
  int64_t max_job_memory_bytes = int64_t{16} << 30;
  int max_epochs = 10'000;
  int max_batch_size = 65'536;
};

// The bytes of one batch's activations and their gradients for `shapes` (from InferShapes, the
// input first), saturating at INT64_MAX instead of overflowing.
int64_t ActivationBytes(const std::vector<Shape>& shapes, int64_t batch_size);

// The preset names, for messages and the CLI: "mnist-mlp", "mnist-cnn".
inline constexpr const char* kPresetNames[] = {"mnist-mlp", "mnist-cnn"};

// What preset `name` sets, in the spec's own terms: optimizer, batch_size and normalization, from
// the same engine reference configs TranslateSpec expands. InvalidArgument for an unknown name.
absl::StatusOr<v1::JobSpec> PresetRecipe(const std::string& name);

// `spec` with the optimizer, batch_size, normalization and precision it leaves unset filled in as
// TranslateSpec fills them (its preset's; kilnd's default normalisation without one; fp32), for
// clients to show what a job trains with. The model stays as the spec names it; an unknown
// preset fills nothing in but the normalisation.
v1::JobSpec ResolvedSpec(const v1::JobSpec& spec);

// Expands the preset, checks every field's range and the model's shapes end to end, and returns
// the engine config. Does not check the dataset or the device (the caller knows those).
absl::StatusOr<TrainConfig> TranslateSpec(const v1::JobSpec& spec, const SpecLimits& limits);

}  // namespace kiln::server
