// Turns a JobSpec message into the engine's TrainConfig, applying presets and checking every
// field, with errors that name the field ("spec.model.layers[2].linear.in_features: ...").
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/trainer.h"
#include "kiln/v1/model_spec.pb.h"

namespace kiln::server {

// Bounds on what a client may ask for. Breaking a range is INVALID_ARGUMENT; a model over the
// size limits is RESOURCE_EXHAUSTED.
struct SpecLimits {
  int max_layers = 64;
  int64_t max_parameters = 50'000'000;
  int64_t max_features = 1'000'000;  // per layer dimension (features, channels, kernel)
  int max_epochs = 10'000;
  int max_batch_size = 65'536;
};

// The epochs, checkpoint policy and so on the engine does not see, with defaults applied.
struct CheckpointSettings {
  int every_n_epochs = 0;
  int keep_last = 0;
  bool keep_best = false;
  bool on_shutdown = true;
};

// The preset names, for messages and the CLI: "mnist-mlp", "mnist-cnn".
inline constexpr const char* kPresetNames[] = {"mnist-mlp", "mnist-cnn"};

// Expands the preset, checks every field's range and the model's shapes end to end, and returns
// the engine config. Does not check the dataset or the device (the caller knows those).
absl::StatusOr<TrainConfig> TranslateSpec(const v1::JobSpec& spec, const SpecLimits& limits);

CheckpointSettings TranslateCheckpointPolicy(const v1::CheckpointPolicy& policy);

// Checks a dataset or job name: 1..64 of [A-Za-z0-9._-], not starting with '.'.
bool IsValidName(const std::string& name);

}  // namespace kiln::server
