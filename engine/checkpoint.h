// Checkpoints: a model's weights (PyTorch state_dict names), optimizer state and training
// position in one safetensors file, written atomically.
//
// Tensors: "<i>.weight", "<i>.bias" as torch.nn.Sequential names them, and optimizer state as
// "optimizer.<param>.<slot>" (so `model.load_state_dict(load_file(path), strict=False)` loads the
// weights in PyTorch). Position, RNG state and the model config live in "__metadata__" strings.
#pragma once

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model.h"
#include "engine/optim/optimizer.h"
#include "engine/trainer.h"

namespace kiln {

inline constexpr char kCheckpointFormat[] = "kiln-checkpoint-1";

absl::Status WriteCheckpoint(const std::string& path, Model& model, Optimizer* optimizer,
                             const TrainingPosition& position,
                             const std::map<std::string, std::string>& extra_metadata = {});

// Loads weights into `model` (every parameter must be present with its exact shape and dtype),
// and when given, the optimizer state and the position. Nothing is changed unless the whole file
// is valid and matches.
absl::Status ReadCheckpoint(const std::string& path, Model& model, Optimizer* optimizer,
                            TrainingPosition* position);

// The metadata strings of a checkpoint (e.g. "kiln.model" and "epochs_done").
absl::StatusOr<std::map<std::string, std::string>> ReadCheckpointMetadata(const std::string& path);

}  // namespace kiln
