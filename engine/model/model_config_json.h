// ModelConfig to and from JSON text, as stored in checkpoint metadata:
// {"input_shape":[1,28,28],"layers":[{"type":"conv2d","in_channels":1,...},...]}; a graph's
// nodes add "name" and "inputs" ({"type":"add","name":"block.add","inputs":["block.conv2","c"]}).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"

namespace kiln {

std::string ModelConfigToJson(const ModelConfig& config);
// Parses and checks field types; InvalidArgument naming the layer and field on error. Shapes are
// checked separately by InferShapes.
absl::StatusOr<ModelConfig> ModelConfigFromJson(const std::string& text);

}  // namespace kiln
