#include "engine/model/model_config_json.h"

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kiln {

namespace {

using nlohmann::json;

struct ToJson {
  json operator()(const LinearConfig& c) const {
    json j = {{"type", "linear"},
              {"in_features", c.in_features},
              {"out_features", c.out_features},
              {"bias", c.bias}};
    if (!c.tie_weight.empty()) j["tie_weight"] = c.tie_weight;  // only where tied
    return j;
  }
  json operator()(const Conv2dConfig& c) const {
    json j = {{"type", "conv2d"},
              {"in_channels", c.in_channels},
              {"out_channels", c.out_channels},
              {"kernel_size", c.kernel_size},
              {"stride", c.stride},
              {"padding", c.padding},
              {"bias", c.bias}};
    // The per-axis forms only where set, so square configs read as they always have.
    for (const auto& [name, v] : {std::pair{"kernel_h", c.kernel_h},
                                  {"kernel_w", c.kernel_w},
                                  {"stride_h", c.stride_h},
                                  {"stride_w", c.stride_w},
                                  {"padding_h", c.padding_h},
                                  {"padding_w", c.padding_w}}) {
      if (v) j[name] = *v;
    }
    return j;
  }
  json operator()(const ReluConfig&) const { return {{"type", "relu"}}; }
  json operator()(const MaxPool2dConfig& c) const {
    return {{"type", "maxpool2d"},
            {"kernel_size", c.kernel_size},
            {"stride", c.stride},
            {"padding", c.padding}};
  }
  json operator()(const AvgPool2dConfig& c) const {
    return {{"type", "avgpool2d"},
            {"kernel_size", c.kernel_size},
            {"stride", c.stride},
            {"padding", c.padding}};
  }
  json operator()(const AdaptiveAvgPool2dConfig& c) const {
    return {{"type", "adaptive_avgpool2d"}, {"output_h", c.output_h}, {"output_w", c.output_w}};
  }
  json operator()(const TanhConfig&) const { return {{"type", "tanh"}}; }
  json operator()(const SigmoidConfig&) const { return {{"type", "sigmoid"}}; }
  json operator()(const GeluConfig&) const { return {{"type", "gelu"}}; }
  json operator()(const LeakyReluConfig& c) const {
    return {{"type", "leaky_relu"}, {"negative_slope", c.negative_slope}};
  }
  json operator()(const SiluConfig&) const { return {{"type", "silu"}}; }
  json operator()(const FlattenConfig&) const { return {{"type", "flatten"}}; }
  json operator()(const DropoutConfig& c) const { return {{"type", "dropout"}, {"p", c.p}}; }
  json operator()(const SoftmaxConfig&) const { return {{"type", "softmax"}}; }
  json operator()(const BatchNorm2dConfig& c) const { return BatchNorm("batchnorm2d", c); }
  json operator()(const BatchNorm1dConfig& c) const { return BatchNorm("batchnorm1d", c); }
  static json BatchNorm(const char* type, const BatchNormFields& c) {
    return {{"type", type},
            {"num_features", c.num_features},
            {"eps", c.eps},
            {"momentum", c.momentum},
            {"affine", c.affine}};
  }
  json operator()(const AddConfig&) const { return {{"type", "add"}}; }
  json operator()(const ConcatConfig&) const { return {{"type", "concat"}}; }
  json operator()(const LayerNormConfig& c) const {
    return {{"type", "layernorm"},
            {"normalized_shape", c.normalized_shape},
            {"eps", c.eps},
            {"affine", c.affine},
            {"bias", c.bias}};
  }
  json operator()(const EmbeddingConfig& c) const {
    return {{"type", "embedding"},
            {"num_embeddings", c.num_embeddings},
            {"embedding_dim", c.embedding_dim}};
  }
  json operator()(const PositionEmbeddingConfig& c) const {
    return {{"type", "position_embedding"},
            {"block_size", c.block_size},
            {"embedding_dim", c.embedding_dim}};
  }
  json operator()(const CausalSelfAttentionConfig& c) const {
    return {{"type", "causal_self_attention"},
            {"n_head", c.n_head},
            {"n_embd", c.n_embd},
            {"bias", c.bias},
            {"dropout", c.dropout}};
  }
};

// A node's optional "name" (a string) and "inputs" (an array of strings).
absl::Status GetGraphFields(const json& l, const std::string& where, std::string* name,
                            std::vector<std::string>* inputs) {
  if (auto it = l.find("name"); it != l.end()) {
    if (!it->is_string()) return absl::InvalidArgumentError(where + ": name must be a string");
    *name = it->get<std::string>();
  }
  if (auto it = l.find("inputs"); it != l.end()) {
    if (!it->is_array()) {
      return absl::InvalidArgumentError(where + ": inputs must be an array of node names");
    }
    for (const auto& in : *it) {
      if (!in.is_string()) {
        return absl::InvalidArgumentError(where + ": inputs must be an array of node names");
      }
      inputs->push_back(in.get<std::string>());
    }
  }
  return absl::OkStatus();
}

// Reads an optional integer field; error names the layer and field.
absl::Status GetInt(const json& j, const char* field, const std::string& where, int64_t* out) {
  auto it = j.find(field);
  if (it == j.end()) return absl::OkStatus();
  if (!it->is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", field, " must be an integer"));
  }
  *out = it->get<int64_t>();
  return absl::OkStatus();
}

absl::Status GetOptionalInt(const json& j, const char* field, const std::string& where,
                            std::optional<int64_t>* out) {
  if (!j.contains(field)) return absl::OkStatus();
  int64_t v = 0;
  KILN_RETURN_IF_ERROR(GetInt(j, field, where, &v));
  *out = v;
  return absl::OkStatus();
}

absl::Status GetFloat(const json& j, const char* field, const std::string& where, float* out) {
  auto it = j.find(field);
  if (it == j.end()) return absl::OkStatus();
  if (!it->is_number()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", field, " must be a number"));
  }
  *out = it->get<float>();
  return absl::OkStatus();
}

absl::Status GetBool(const json& j, const char* field, const std::string& where, bool* out) {
  auto it = j.find(field);
  if (it == j.end()) return absl::OkStatus();
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", field, " must be true or false"));
  }
  *out = it->get<bool>();
  return absl::OkStatus();
}

absl::Status GetDouble(const json& j, const char* field, const std::string& where, double* out) {
  auto it = j.find(field);
  if (it == j.end()) return absl::OkStatus();
  if (!it->is_number()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", field, " must be a number"));
  }
  *out = it->get<double>();
  return absl::OkStatus();
}

absl::Status GetBatchNorm(const json& j, const std::string& where, BatchNormFields* c) {
  absl::Status s;
  s.Update(GetInt(j, "num_features", where, &c->num_features));
  s.Update(GetDouble(j, "eps", where, &c->eps));
  s.Update(GetDouble(j, "momentum", where, &c->momentum));
  s.Update(GetBool(j, "affine", where, &c->affine));
  return s;
}

}  // namespace

std::string ModelConfigToJson(const ModelConfig& config) {
  json layers = json::array();
  for (size_t i = 0; i < config.layers.size(); ++i) {
    json l = std::visit(ToJson{}, config.layers[i]);
    // Only a graph's nodes carry these, so a Sequential model's JSON is as it always was.
    if (i < config.names.size() && !config.names[i].empty()) l["name"] = config.names[i];
    if (!NodeInputs(config, i).empty()) l["inputs"] = NodeInputs(config, i);
    layers.push_back(std::move(l));
  }
  json out = {{"input_shape", config.input_shape}, {"layers", layers}};
  if (config.init == InitRule::kGpt2) out["init"] = "gpt2";  // only where set, as names are
  return out.dump();
}

namespace {

// One layer's config from its JSON object `l` of type `type`; errors name `where`.
absl::StatusOr<LayerConfig> LayerFromJson(const json& l, const std::string& type,
                                          const std::string& where) {
  // The fields' errors, gathered; the layer is returned only when all were read.
  absl::Status s;
  const auto Layer = [](const absl::Status& read, LayerConfig c) -> absl::StatusOr<LayerConfig> {
    if (!read.ok()) return read;
    return c;
  };
  if (type == "linear") {
    LinearConfig c;
    s.Update(GetInt(l, "in_features", where, &c.in_features));
    s.Update(GetInt(l, "out_features", where, &c.out_features));
    s.Update(GetBool(l, "bias", where, &c.bias));
    if (auto it = l.find("tie_weight"); it != l.end()) {
      if (!it->is_string()) {
        return absl::InvalidArgumentError(where + ": tie_weight must be a string");
      }
      c.tie_weight = it->get<std::string>();
    }
    return Layer(s, c);
  } else if (type == "conv2d") {
    Conv2dConfig c;
    s.Update(GetInt(l, "in_channels", where, &c.in_channels));
    s.Update(GetInt(l, "out_channels", where, &c.out_channels));
    s.Update(GetInt(l, "kernel_size", where, &c.kernel_size));
    s.Update(GetInt(l, "stride", where, &c.stride));
    s.Update(GetInt(l, "padding", where, &c.padding));
    s.Update(GetBool(l, "bias", where, &c.bias));
    s.Update(GetOptionalInt(l, "kernel_h", where, &c.kernel_h));
    s.Update(GetOptionalInt(l, "kernel_w", where, &c.kernel_w));
    s.Update(GetOptionalInt(l, "stride_h", where, &c.stride_h));
    s.Update(GetOptionalInt(l, "stride_w", where, &c.stride_w));
    s.Update(GetOptionalInt(l, "padding_h", where, &c.padding_h));
    s.Update(GetOptionalInt(l, "padding_w", where, &c.padding_w));
    return Layer(s, c);
  } else if (type == "relu") {
    return Layer(s, ReluConfig{});
  } else if (type == "maxpool2d") {
    MaxPool2dConfig c;
    s.Update(GetInt(l, "kernel_size", where, &c.kernel_size));
    s.Update(GetInt(l, "stride", where, &c.stride));
    s.Update(GetInt(l, "padding", where, &c.padding));
    return Layer(s, c);
  } else if (type == "avgpool2d") {
    AvgPool2dConfig c;
    s.Update(GetInt(l, "kernel_size", where, &c.kernel_size));
    s.Update(GetInt(l, "stride", where, &c.stride));
    s.Update(GetInt(l, "padding", where, &c.padding));
    return Layer(s, c);
  } else if (type == "adaptive_avgpool2d") {
    AdaptiveAvgPool2dConfig c;
    s.Update(GetInt(l, "output_h", where, &c.output_h));
    s.Update(GetInt(l, "output_w", where, &c.output_w));
    return Layer(s, c);
  } else if (type == "tanh") {
    return Layer(s, TanhConfig{});
  } else if (type == "sigmoid") {
    return Layer(s, SigmoidConfig{});
  } else if (type == "gelu") {
    return Layer(s, GeluConfig{});
  } else if (type == "leaky_relu") {
    LeakyReluConfig c;
    s.Update(GetFloat(l, "negative_slope", where, &c.negative_slope));
    return Layer(s, c);
  } else if (type == "silu") {
    return Layer(s, SiluConfig{});
  } else if (type == "flatten") {
    return Layer(s, FlattenConfig{});
  } else if (type == "dropout") {
    DropoutConfig c;
    if (l.contains("p")) {
      if (!l["p"].is_number()) return absl::InvalidArgumentError(where + ": p must be a number");
      c.p = l["p"].get<float>();
    }
    return Layer(s, c);
  } else if (type == "softmax") {
    return Layer(s, SoftmaxConfig{});
  } else if (type == "batchnorm2d") {
    BatchNorm2dConfig c;
    s.Update(GetBatchNorm(l, where, &c));
    return Layer(s, c);
  } else if (type == "batchnorm1d") {
    BatchNorm1dConfig c;
    s.Update(GetBatchNorm(l, where, &c));
    return Layer(s, c);
  } else if (type == "add") {
    return Layer(s, AddConfig{});
  } else if (type == "concat") {
    return Layer(s, ConcatConfig{});
  } else if (type == "layernorm") {
    LayerNormConfig c;
    s.Update(GetInt(l, "normalized_shape", where, &c.normalized_shape));
    s.Update(GetDouble(l, "eps", where, &c.eps));
    s.Update(GetBool(l, "affine", where, &c.affine));
    s.Update(GetBool(l, "bias", where, &c.bias));
    return Layer(s, c);
  } else if (type == "embedding") {
    EmbeddingConfig c;
    s.Update(GetInt(l, "num_embeddings", where, &c.num_embeddings));
    s.Update(GetInt(l, "embedding_dim", where, &c.embedding_dim));
    return Layer(s, c);
  } else if (type == "position_embedding") {
    PositionEmbeddingConfig c;
    s.Update(GetInt(l, "block_size", where, &c.block_size));
    s.Update(GetInt(l, "embedding_dim", where, &c.embedding_dim));
    return Layer(s, c);
  } else if (type == "causal_self_attention") {
    CausalSelfAttentionConfig c;
    s.Update(GetInt(l, "n_head", where, &c.n_head));
    s.Update(GetInt(l, "n_embd", where, &c.n_embd));
    s.Update(GetBool(l, "bias", where, &c.bias));
    s.Update(GetFloat(l, "dropout", where, &c.dropout));
    return Layer(s, c);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(where,
                   ": unknown layer type (linear, conv2d, relu, maxpool2d, flatten, dropout, "
                   "softmax, avgpool2d, adaptive_avgpool2d, tanh, sigmoid, gelu, leaky_relu, "
                   "silu, batchnorm2d, batchnorm1d, add, concat, layernorm, embedding, "
                   "position_embedding, causal_self_attention)"));
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfigFromJson(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("model config is not a JSON object");
  }
  ModelConfig config;
  auto shape = j.find("input_shape");
  if (shape == j.end() || !shape->is_array()) {
    return absl::InvalidArgumentError("model config: input_shape must be an array of integers");
  }
  for (const auto& d : *shape) {
    if (!d.is_number_integer()) {
      return absl::InvalidArgumentError("model config: input_shape must be an array of integers");
    }
    config.input_shape.push_back(d.get<int64_t>());
  }
  if (auto init = j.find("init"); init != j.end()) {
    if (!init->is_string() || (*init != "default" && *init != "gpt2")) {
      return absl::InvalidArgumentError("model config: init must be \"default\" or \"gpt2\"");
    }
    config.init = *init == "gpt2" ? InitRule::kGpt2 : InitRule::kDefault;
  }
  auto layers = j.find("layers");
  if (layers == j.end() || !layers->is_array()) {
    return absl::InvalidArgumentError("model config: layers must be an array");
  }
  for (size_t i = 0; i < layers->size(); ++i) {
    const json& l = (*layers)[i];
    std::string where = absl::StrCat("layer ", i);
    if (!l.is_object() || !l.contains("type") || !l["type"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": needs a \"type\" string"));
    }
    const std::string type = l["type"].get<std::string>();
    where = absl::StrCat(where, " ", type);
    KILN_ASSIGN_OR_RETURN(LayerConfig layer, LayerFromJson(l, type, where));
    config.layers.push_back(std::move(layer));
    std::string name;
    std::vector<std::string> inputs;
    KILN_RETURN_IF_ERROR(GetGraphFields(l, where, &name, &inputs));
    if (!name.empty()) {
      config.names.resize(i + 1);
      config.names[i] = std::move(name);
    }
    if (!inputs.empty()) {
      config.inputs.resize(i + 1);
      config.inputs[i] = std::move(inputs);
    }
  }
  return config;
}

}  // namespace kiln
