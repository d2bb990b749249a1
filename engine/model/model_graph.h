// The DAG of a ModelConfig: each node's name and the values it reads, checked (names, references,
// fan-in, unused nodes), plus where backward needs scratch to sum the gradients of a value read
// more than once. Usable without a backend, like InferShapes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"

namespace kiln {

// Values are numbered as InferShapes' shapes: 0 is the model input, i + 1 the output of node i.
struct ModelGraph {
  std::vector<std::string> names;        // per node, NodeName's
  std::vector<std::vector<int>> inputs;  // per node, the values it reads, in order
  std::vector<int> readers;              // per value, how many input slots read it
  // Per node and input slot: backward writes that input's gradient to scratch and adds it to the
  // value's gradient, as another slot (later in the model) wrote it first. Never for value 0.
  std::vector<std::vector<bool>> sums_gradient;
};

// The most inputs one node may have.
inline constexpr int kMaxNodeInputs = 64;

// Resolves and checks the graph: names are letters, digits, '_' and '.' (no empty segment, at
// most 128 characters, not "input", not starting with "optimizer"), unique; inputs name earlier
// nodes or "input" (so there are no cycles); only add and concat take several inputs; every node
// but the last is read. InvalidArgument naming the node ("node layer1.0.add: ..."; an unnamed
// node is "layer 3 relu").
absl::StatusOr<ModelGraph> ResolveGraph(const ModelConfig& config);

// How node i is named in messages: "node layer1.0.conv1", or "layer 3 conv2d" when unnamed.
std::string NodeLabel(const ModelConfig& config, size_t i);

// The key of a node's tensor in the state dict: "layer1.0.conv1.weight", "3.bias". The one rule
// for parameters and buffers alike.
std::string StateDictName(const std::string& node, const std::string& tensor);

// Elements per sample of each scratch slot backward needs (slot k serves input slot k of any
// node), given InferShapes' shapes: the gradient scratch of values read more than once.
std::vector<int64_t> GradientScratchElements(const ModelGraph& graph,
                                             const std::vector<Shape>& shapes);

}  // namespace kiln
