// kiln checkpoint -> ONNX model: the network of its kiln.model config with its weights and
// BatchNorm running statistics, the input normalisation of kiln.norm folded in at the start, and
// a softmax after the logits. What `kiln export JOB --format onnx` writes.
//
// The graph (opset kOnnxOpset, IR version 7; batch dimension "N"):
//   input          UINT8 [N, ...input_shape]: raw pixels 0..255, for image models; FLOAT for
//                  table models (raw feature values, as in the CSV)
//                  -> Cast -> Mul(scale) -> Sub(mean) -> Div(std), per channel where kiln.norm is;
//                  INT64 [N, T] token ids for sequence models (a GPT), T up to input_shape[0]
//   logits         FLOAT [N, classes]: the last layer's output ([N, T, vocab] for a GPT)
//   probabilities  FLOAT [N, classes]: Softmax(logits) (alone when the model ends in softmax)
// A GPT's layers become opset-13 ops: embedding Gather, position_embedding Add of the table's
// first T rows (Slice), layernorm ReduceMean/Sub/Mul/Sqrt/Div (no LayerNormalization before
// opset 17), a linear over positions Transpose + MatMul + Add, causal_self_attention MatMul,
// Split, Reshape, Transpose, a scale, an additive -inf causal mask and Softmax; a tied lm_head
// reads the embedding's initializer.
// Initializers keep the checkpoint's state-dict names ("0.weight", "layer1.0.bn1.running_mean").
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "onnx/onnx.pb.h"

namespace kiln::client {

// Opset 13: checked by Debian's onnx 1.12 and run by every ONNX runtime of the last years.
inline constexpr int64_t kOnnxOpset = 13;
inline constexpr char kOnnxInput[] = "input";
inline constexpr char kOnnxLogits[] = "logits";
inline constexpr char kOnnxProbabilities[] = "probabilities";
inline constexpr char kOnnxLength[] = "T";  // a token model's symbolic sequence length

// The ONNX model of the checkpoint at `checkpoint_path`. InvalidArgument or DataLoss for a file
// that is not a valid kiln checkpoint; Unimplemented naming the node for a layer or
// normalisation ONNX cannot express.
absl::StatusOr<::onnx::ModelProto> CheckpointToOnnx(const std::string& checkpoint_path);

// CheckpointToOnnx, written to `onnx_path` atomically (temp file, fsync, rename).
absl::Status ExportOnnx(const std::string& checkpoint_path, const std::string& onnx_path);

}  // namespace kiln::client
