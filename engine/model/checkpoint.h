// Checkpoints: a model's weights (PyTorch state_dict names), optimizer state and training
// position in one safetensors file, written atomically.
//
// Tensors: "<i>.weight", "<i>.bias" as torch.nn.Sequential names them, the layers' buffers
// ("<i>.running_mean", "<i>.running_var" F32, "<i>.num_batches_tracked" a 0-dim I64, as
// BatchNorm's state_dict), and optimizer state as "optimizer.<param>.<slot>" (so
// `model.load_state_dict(load_file(path), strict=False)` loads weights and buffers in PyTorch).
// Position, RNG state, the model config and the input normalisation live in
// "__metadata__" strings, whose names only checkpoint.cc knows; the rest of kiln reads them typed
// (CheckpointInfo).
#pragma once

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"
#include "engine/optim/optimizer.h"
#include "engine/training_position.h"

namespace kiln {

inline constexpr char kCheckpointFormat[] = "kiln-checkpoint-1";

// What a checkpoint says of itself besides its tensors.
struct CheckpointInfo {
  ModelConfig model;
  PixelNorm norm;  // the input normalisation the model was trained with
  TrainingPosition position;
  // A character-level language model's vocabulary (kiln.vocabulary): a JSON list of its
  // characters in id order, as the text dataset it trained on has it; empty otherwise.
  std::string vocabulary;
};

// Writes the model's weights and buffers, the optimizer's state (when given), the position and
// `norm`, and `vocabulary` when not empty (CheckpointInfo::vocabulary).
absl::Status WriteCheckpoint(const std::string& path, Model& model, Optimizer* optimizer,
                             const TrainingPosition& position, const PixelNorm& norm,
                             const std::string& vocabulary = "");

// Loads weights and buffers into `model` (every one must be present with its exact shape and
// dtype), and when given, the optimizer state and the position. Nothing is changed unless the
// whole file is valid and matches.
absl::Status ReadCheckpoint(const std::string& path, Model& model, Optimizer* optimizer,
                            TrainingPosition* position);

// The typed metadata of a kiln checkpoint: InvalidArgument for a file that is not one, DataLoss
// for a missing or malformed entry. A checkpoint without a recorded normalisation gets PixelNorm's
// defaults.
absl::StatusOr<CheckpointInfo> ReadCheckpointInfo(const std::string& path);

// The raw metadata strings of a checkpoint (e.g. "kiln.model" and "epochs_done"), for tools.
absl::StatusOr<std::map<std::string, std::string>> ReadCheckpointMetadata(const std::string& path);

}  // namespace kiln
