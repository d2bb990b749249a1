#include "client/onnx/onnx_graph_builder.h"

#include <cstring>

namespace kiln::client {
namespace {

void SetBatchedType(::onnx::ValueInfoProto* info, const std::string& name, int32_t elem_type,
                    const std::vector<int64_t>& sample_dims, const std::string& length_param) {
  info->set_name(name);
  ::onnx::TypeProto_Tensor* tensor = info->mutable_type()->mutable_tensor_type();
  tensor->set_elem_type(elem_type);
  ::onnx::TensorShapeProto* shape = tensor->mutable_shape();
  shape->add_dim()->set_dim_param("N");
  for (size_t i = 0; i < sample_dims.size(); ++i) {
    if (i == 0 && !length_param.empty()) {
      shape->add_dim()->set_dim_param(length_param);
    } else {
      shape->add_dim()->set_dim_value(sample_dims[i]);
    }
  }
}

}  // namespace

::onnx::NodeProto* OnnxGraphBuilder::AddNode(const std::string& op, const std::string& name,
                                             const std::vector<std::string>& inputs,
                                             const std::vector<std::string>& outputs) {
  ::onnx::NodeProto* node = graph_->add_node();
  node->set_op_type(op);
  node->set_name(name);
  for (const std::string& in : inputs) node->add_input(in);
  for (const std::string& out : outputs) node->add_output(out);
  return node;
}

const std::string& OnnxGraphBuilder::AddInitializer(const std::string& name,
                                                    const std::vector<int64_t>& dims,
                                                    const std::vector<float>& values) {
  ::onnx::TensorProto* t = graph_->add_initializer();
  t->set_name(name);
  t->set_data_type(::onnx::TensorProto::FLOAT);
  for (int64_t d : dims) t->add_dims(d);
  // raw_data is little-endian float32, as kiln's hosts and safetensors store them.
  std::string raw(values.size() * sizeof(float), '\0');
  if (!values.empty()) std::memcpy(raw.data(), values.data(), raw.size());
  t->set_raw_data(std::move(raw));
  return t->name();
}

const std::string& OnnxGraphBuilder::AddInitializerI64(const std::string& name,
                                                       const std::vector<int64_t>& dims,
                                                       const std::vector<int64_t>& values) {
  ::onnx::TensorProto* t = graph_->add_initializer();
  t->set_name(name);
  t->set_data_type(::onnx::TensorProto::INT64);
  for (int64_t d : dims) t->add_dims(d);
  for (int64_t v : values) t->add_int64_data(v);
  return t->name();
}

void OnnxGraphBuilder::AddInput(const std::string& name, int32_t elem_type,
                                const std::vector<int64_t>& sample_dims,
                                const std::string& length_param) {
  SetBatchedType(graph_->add_input(), name, elem_type, sample_dims, length_param);
}

void OnnxGraphBuilder::AddOutput(const std::string& name, int32_t elem_type,
                                 const std::vector<int64_t>& sample_dims,
                                 const std::string& length_param) {
  SetBatchedType(graph_->add_output(), name, elem_type, sample_dims, length_param);
}

void SetAttribute(::onnx::NodeProto* node, const std::string& name, int64_t value) {
  ::onnx::AttributeProto* a = node->add_attribute();
  a->set_name(name);
  a->set_type(::onnx::AttributeProto::INT);
  a->set_i(value);
}

void SetAttribute(::onnx::NodeProto* node, const std::string& name, float value) {
  ::onnx::AttributeProto* a = node->add_attribute();
  a->set_name(name);
  a->set_type(::onnx::AttributeProto::FLOAT);
  a->set_f(value);
}

void SetAttribute(::onnx::NodeProto* node, const std::string& name,
                  const std::vector<int64_t>& values) {
  ::onnx::AttributeProto* a = node->add_attribute();
  a->set_name(name);
  a->set_type(::onnx::AttributeProto::INTS);
  for (int64_t v : values) a->add_ints(v);
}

}  // namespace kiln::client
