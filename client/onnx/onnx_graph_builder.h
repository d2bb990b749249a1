// A thin writer over onnx::GraphProto: nodes with attributes, float initializers and the typed
// graph inputs and outputs, so the exporter reads as the list of ops it emits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "onnx/onnx.pb.h"

namespace kiln::client {

class OnnxGraphBuilder {
 public:
  explicit OnnxGraphBuilder(::onnx::GraphProto* graph) : graph_(graph) {}

  // Appends a node named `name` running `op` over `inputs` into `outputs` (tensor names; "" is
  // an omitted optional input). The node stays owned by the graph; add attributes through it.
  ::onnx::NodeProto* AddNode(const std::string& op, const std::string& name,
                             const std::vector<std::string>& inputs,
                             const std::vector<std::string>& outputs);
  // The node added last (there must be one).
  ::onnx::NodeProto* last_node() { return graph_->mutable_node(graph_->node_size() - 1); }

  // A float32 constant of `dims` (row-major `values`, NumElements(dims) of them); returns `name`.
  const std::string& AddInitializer(const std::string& name, const std::vector<int64_t>& dims,
                                    const std::vector<float>& values);

  // An int64 constant of `dims` (shapes, axes and slice bounds); returns `name`.
  const std::string& AddInitializerI64(const std::string& name, const std::vector<int64_t>& dims,
                                       const std::vector<int64_t>& values);

  // A graph input or output of `elem_type` (onnx::TensorProto::FLOAT, UINT8, INT64) whose first
  // dimension is the symbolic batch "N" and the rest `sample_dims`; with `length_param`, the
  // first sample dimension is that symbol instead (a sequence's length "T", any up to its size).
  void AddInput(const std::string& name, int32_t elem_type, const std::vector<int64_t>& sample_dims,
                const std::string& length_param = "");
  void AddOutput(const std::string& name, int32_t elem_type,
                 const std::vector<int64_t>& sample_dims, const std::string& length_param = "");

 private:
  ::onnx::GraphProto* graph_;
};

void SetAttribute(::onnx::NodeProto* node, const std::string& name, int64_t value);
void SetAttribute(::onnx::NodeProto* node, const std::string& name, float value);
void SetAttribute(::onnx::NodeProto* node, const std::string& name,
                  const std::vector<int64_t>& values);

}  // namespace kiln::client
