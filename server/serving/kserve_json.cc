#include "server/serving/kserve_json.h"

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/json_bounds.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "server/serving/infer_body_reader.h"

namespace kiln::serving {
namespace {

using nlohmann::json;

absl::Status Invalid(absl::string_view what) { return absl::InvalidArgumentError(what); }

// Serialises without throwing: names echoed from a client may hold invalid UTF-8, which is
// replaced rather than thrown on.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

absl::StatusOr<json> ParseObject(absl::string_view text, absl::string_view what) {
  if (text.find_first_not_of(" \t\r\n") == absl::string_view::npos) return json::object();
  KILN_ASSIGN_OR_RETURN(json value, ParseJsonWithin(text, what));
  if (!value.is_object()) return Invalid(absl::StrCat(what, " must be a JSON object"));
  return value;
}

// A "parameters" object as the protocol's InferParameter map.
absl::Status ReadInferParameters(
    const json& params, absl::string_view who,
    google::protobuf::Map<std::string, inference::InferParameter>* out) {
  if (!params.is_object()) return Invalid(absl::StrCat(who, ".parameters must be an object"));
  for (const auto& [key, v] : params.items()) {
    inference::InferParameter& p = (*out)[key];
    if (v.is_boolean()) {
      p.set_bool_param(v.get<bool>());
    } else if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX}) {
      p.set_uint64_param(v.get<uint64_t>());
    } else if (v.is_number_integer()) {
      p.set_int64_param(v.get<int64_t>());
    } else if (v.is_number_float()) {
      p.set_double_param(v.get<double>());
    } else if (v.is_string()) {
      p.set_string_param(v.get<std::string>());
    } else {
      return Invalid(absl::StrCat(who, ".parameters.", key, ": must be a bool, number or string"));
    }
  }
  return absl::OkStatus();
}

json ParametersJson(const google::protobuf::Map<std::string, inference::InferParameter>& params) {
  json out = json::object();
  for (const auto& [key, p] : params) {
    switch (p.parameter_choice_case()) {
      case inference::InferParameter::kBoolParam:
        out[key] = p.bool_param();
        break;
      case inference::InferParameter::kInt64Param:
        out[key] = p.int64_param();
        break;
      case inference::InferParameter::kStringParam:
        out[key] = p.string_param();
        break;
      case inference::InferParameter::kDoubleParam:
        out[key] = p.double_param();
        break;
      case inference::InferParameter::kUint64Param:
        out[key] = p.uint64_param();
        break;
      default:
        break;
    }
  }
  return out;
}

// Whether `params` holds binary_data: true. Removed from the message either way: it is how
// this transport carries the tensor, not something the model reads.
absl::StatusOr<bool> TakeBoolParameter(
    google::protobuf::Map<std::string, inference::InferParameter>* params, const std::string& key,
    absl::string_view who) {
  auto it = params->find(key);
  if (it == params->end()) return false;
  if (it->second.parameter_choice_case() != inference::InferParameter::kBoolParam) {
    return Invalid(absl::StrCat(who, ".parameters.", key, ": must be true or false"));
  }
  const bool value = it->second.bool_param();
  params->erase(it);
  return value;
}

absl::StatusOr<std::string> StringField(const json& object, const char* key, absl::string_view who,
                                        bool required) {
  auto it = object.find(key);
  if (it == object.end()) {
    if (required) return Invalid(absl::StrCat(who, ".", key, ": required"));
    return std::string();
  }
  if (!it->is_string()) return Invalid(absl::StrCat(who, ".", key, ": must be a string"));
  return it->get<std::string>();
}

// One output's elements as JSON, from typed contents or from its raw bytes (little-endian).
json OutputData(const inference::ModelInferResponse::InferOutputTensor& out,
                const std::string* raw) {
  json data = json::array();
  const auto& c = out.contents();
  if (raw == nullptr) {
    if (out.datatype() == "FP32") {
      for (float v : c.fp32_contents()) data.push_back(v);
    } else if (out.datatype() == "INT64") {
      for (int64_t v : c.int64_contents()) data.push_back(v);
    } else if (out.datatype() == "FP64") {
      for (double v : c.fp64_contents()) data.push_back(v);
    } else if (out.datatype() == "BOOL") {
      for (bool v : c.bool_contents()) data.push_back(v);
    } else {
      for (int32_t v : c.int_contents()) data.push_back(v);
      for (uint32_t v : c.uint_contents()) data.push_back(v);
      for (uint64_t v : c.uint64_contents()) data.push_back(v);
    }
    return data;
  }
  if (out.datatype() == "FP32") {
    for (size_t i = 0; i + 4 <= raw->size(); i += 4) {
      float v;
      std::memcpy(&v, raw->data() + i, 4);
      data.push_back(v);
    }
  } else if (out.datatype() == "INT64") {
    for (size_t i = 0; i + 8 <= raw->size(); i += 8) {
      int64_t v;
      std::memcpy(&v, raw->data() + i, 8);
      data.push_back(v);
    }
  }
  return data;
}

// One output's elements as bytes, little-endian, as the binary extension carries them.
std::string OutputBytes(const inference::ModelInferResponse::InferOutputTensor& out,
                        const std::string* raw) {
  if (raw != nullptr) return *raw;
  const auto& c = out.contents();
  std::string bytes;
  auto append = [&bytes](const void* p, size_t n) { bytes.append(static_cast<const char*>(p), n); };
  if (out.datatype() == "FP32") {
    append(c.fp32_contents().data(), c.fp32_contents_size() * sizeof(float));
  } else if (out.datatype() == "INT64") {
    append(c.int64_contents().data(), c.int64_contents_size() * sizeof(int64_t));
  } else if (out.datatype() == "FP64") {
    append(c.fp64_contents().data(), c.fp64_contents_size() * sizeof(double));
  }
  return bytes;
}

json TensorMetadataJson(const inference::ModelMetadataResponse::TensorMetadata& t) {
  return {{"name", t.name()},
          {"datatype", t.datatype()},
          {"shape", std::vector<int64_t>(t.shape().begin(), t.shape().end())}};
}

// Input i of a REST inference request into out->request: its tensor from JSON data, or from the
// next binary_data_size bytes of `binary` (after *binary_used, which it advances; only with the
// Inference-Header-Content-Length header). Counts JSON inputs in *json_inputs.
absl::Status ReadInferInput(json& in, size_t i, absl::string_view binary, bool length_header,
                            size_t* binary_used, int* json_inputs, RestInferRequest* out) {
  const std::string who = absl::StrCat("inputs[", i, "]");
  if (!in.is_object()) return Invalid(absl::StrCat(who, ": must be an object"));
  auto* tensor = out->request.add_inputs();
  KILN_ASSIGN_OR_RETURN(std::string name, StringField(in, "name", who, true));
  KILN_ASSIGN_OR_RETURN(std::string datatype, StringField(in, "datatype", who, true));
  tensor->set_name(name);
  tensor->set_datatype(datatype);
  const std::string named = absl::StrCat("input \"", name, "\"");
  auto shape = in.find("shape");
  if (shape == in.end() || !shape->is_array()) {
    return Invalid(absl::StrCat(named, ": shape: required, an array of integers"));
  }
  for (const json& d : *shape) {
    if (!d.is_number_integer()) {
      return Invalid(absl::StrCat(named, ": shape: ", JsonPreview(d), " is not an integer"));
    }
    tensor->add_shape(d.get<int64_t>());
  }
  int64_t binary_size = -1;
  if (auto params = in.find("parameters"); params != in.end()) {
    KILN_RETURN_IF_ERROR(ReadInferParameters(*params, named, tensor->mutable_parameters()));
    auto size = tensor->mutable_parameters()->find("binary_data_size");
    if (size != tensor->mutable_parameters()->end()) {
      if (size->second.parameter_choice_case() != inference::InferParameter::kInt64Param ||
          size->second.int64_param() < 0) {
        return Invalid(absl::StrCat(named, ": parameters.binary_data_size: must be a byte count"));
      }
      binary_size = size->second.int64_param();
      tensor->mutable_parameters()->erase(size);
    }
  }
  auto data = in.find("data");
  if (binary_size >= 0) {
    if (!length_header) {
      return Invalid(absl::StrCat(named,
                                  ": binary_data_size needs the "
                                  "Inference-Header-Content-Length header"));
    }
    if (data != in.end()) {
      return Invalid(absl::StrCat(named, ": has both data and binary_data_size"));
    }
    if (binary_size > static_cast<int64_t>(binary.size() - *binary_used)) {
      return Invalid(absl::StrCat(named, ": binary_data_size ", binary_size, " is more than the ",
                                  binary.size() - *binary_used, " bytes left in the body"));
    }
    out->request.add_raw_input_contents(std::string(binary.substr(*binary_used, binary_size)));
    *binary_used += static_cast<size_t>(binary_size);
    out->binary_input = true;
    return absl::OkStatus();
  }
  ++*json_inputs;
  if (data == in.end()) {
    return Invalid(absl::StrCat(named,
                                ": data: required (or binary data with "
                                "parameters.binary_data_size)"));
  }
  absl::Status filled = UnpackTensorData(*data, datatype, tensor->mutable_contents());
  if (!filled.ok()) return Invalid(absl::StrCat(named, ": ", filled.message()));
  *data = nullptr;  // the packed elements, no longer needed beside the typed ones
  return absl::OkStatus();
}

// The request's "outputs" (which, and which as binary data) into out.
absl::Status ReadRequestedOutputs(const json& outputs, RestInferRequest* out) {
  if (!outputs.is_array()) return Invalid("outputs: must be an array");
  for (size_t i = 0; i < outputs.size(); ++i) {
    const json& o = outputs[i];
    const std::string who = absl::StrCat("outputs[", i, "]");
    if (!o.is_object()) return Invalid(absl::StrCat(who, ": must be an object"));
    auto* requested = out->request.add_outputs();
    KILN_ASSIGN_OR_RETURN(std::string name, StringField(o, "name", who, true));
    requested->set_name(name);
    if (auto params = o.find("parameters"); params != o.end()) {
      KILN_RETURN_IF_ERROR(ReadInferParameters(*params, who, requested->mutable_parameters()));
      KILN_ASSIGN_OR_RETURN(bool binary_out,
                            TakeBoolParameter(requested->mutable_parameters(), "binary_data", who));
      if (binary_out) out->binary_outputs.insert(name);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RestInferRequest> ParseInferRequest(absl::string_view body,
                                                   std::optional<size_t> json_size,
                                                   const std::string& model,
                                                   const std::string& version) {
  absl::string_view head = body;
  absl::string_view binary;
  if (json_size.has_value()) {
    if (*json_size > body.size()) {
      return Invalid(absl::StrCat("Inference-Header-Content-Length ", *json_size,
                                  " is larger than the body (", body.size(), " bytes)"));
    }
    head = body.substr(0, *json_size);
    binary = body.substr(*json_size);
  }
  // Each input's "data" comes packed, not as a tree: see infer_body_reader.h.
  KILN_ASSIGN_OR_RETURN(json j, ReadInferBody(head, "the request body"));
  if (!j.is_object()) return Invalid("the request body must be a JSON object");
  RestInferRequest out;
  inference::ModelInferRequest& r = out.request;
  r.set_model_name(model);
  r.set_model_version(version);
  KILN_ASSIGN_OR_RETURN(std::string id, StringField(j, "id", "request", false));
  r.set_id(id);
  if (auto it = j.find("parameters"); it != j.end()) {
    KILN_RETURN_IF_ERROR(ReadInferParameters(*it, "request", r.mutable_parameters()));
    KILN_ASSIGN_OR_RETURN(
        out.all_outputs_binary,
        TakeBoolParameter(r.mutable_parameters(), "binary_data_output", "request"));
  }
  auto inputs = j.find("inputs");
  if (inputs == j.end() || !inputs->is_array()) return Invalid("inputs: required, an array");
  size_t binary_used = 0;
  int json_inputs = 0;
  for (size_t i = 0; i < inputs->size(); ++i) {
    KILN_RETURN_IF_ERROR(ReadInferInput((*inputs)[i], i, binary, json_size.has_value(),
                                        &binary_used, &json_inputs, &out));
  }
  if (out.binary_input && json_inputs > 0) {
    return Invalid("inputs: either all as binary data or all as JSON data, not both");
  }
  if (binary_used != binary.size()) {
    return Invalid(absl::StrCat("the body has ", binary.size() - binary_used,
                                " bytes of binary data that no input's binary_data_size claims"));
  }
  if (auto outputs = j.find("outputs"); outputs != j.end()) {
    KILN_RETURN_IF_ERROR(ReadRequestedOutputs(*outputs, &out));
  }
  return out;
}

RestBody WriteInferResponse(const inference::ModelInferResponse& response,
                            const RestInferRequest& request) {
  json j = {{"model_name", response.model_name()}, {"model_version", response.model_version()}};
  if (!response.id().empty()) j["id"] = response.id();
  if (!response.parameters().empty()) j["parameters"] = ParametersJson(response.parameters());
  json outputs = json::array();
  std::string binary;
  const bool raw =
      response.raw_output_contents_size() == response.outputs_size() && response.outputs_size() > 0;
  for (int i = 0; i < response.outputs_size(); ++i) {
    const auto& out = response.outputs(i);
    const std::string* bytes = raw ? &response.raw_output_contents(i) : nullptr;
    json o = {{"name", out.name()},
              {"datatype", out.datatype()},
              {"shape", std::vector<int64_t>(out.shape().begin(), out.shape().end())}};
    json params = ParametersJson(out.parameters());
    if (request.all_outputs_binary || request.binary_outputs.count(out.name()) > 0) {
      const std::string data = OutputBytes(out, bytes);
      params["binary_data_size"] = data.size();
      binary += data;
    } else {
      o["data"] = OutputData(out, bytes);
    }
    if (!params.empty()) o["parameters"] = std::move(params);
    outputs.push_back(std::move(o));
  }
  j["outputs"] = std::move(outputs);
  RestBody result;
  result.body = Dump(j);
  if (request.all_outputs_binary || !request.binary_outputs.empty()) {
    result.json_size = result.body.size();
    result.body += binary;
  }
  return result;
}

std::string ServerMetadataJson(const inference::ServerMetadataResponse& metadata) {
  return Dump(json{{"name", metadata.name()},
                   {"version", metadata.version()},
                   {"extensions", std::vector<std::string>(metadata.extensions().begin(),
                                                           metadata.extensions().end())}});
}

std::string ModelMetadataJson(const inference::ModelMetadataResponse& metadata) {
  json inputs = json::array(), outputs = json::array();
  for (const auto& t : metadata.inputs()) inputs.push_back(TensorMetadataJson(t));
  for (const auto& t : metadata.outputs()) outputs.push_back(TensorMetadataJson(t));
  json out{{"name", metadata.name()},
           {"versions",
            std::vector<std::string>(metadata.versions().begin(), metadata.versions().end())},
           {"platform", metadata.platform()},
           {"inputs", std::move(inputs)},
           {"outputs", std::move(outputs)}};
  if (!metadata.parameters().empty()) out["parameters"] = ParametersJson(metadata.parameters());
  return Dump(out);
}

std::string RepositoryIndexJson(const inference::RepositoryIndexResponse& index) {
  json models = json::array();
  for (const auto& m : index.models()) {
    json entry = {{"name", m.name()}, {"state", m.state()}};
    if (!m.version().empty()) entry["version"] = m.version();
    if (!m.reason().empty()) entry["reason"] = m.reason();
    models.push_back(std::move(entry));
  }
  return Dump(models);
}

absl::StatusOr<inference::RepositoryIndexRequest> ParseIndexRequest(absl::string_view body) {
  KILN_ASSIGN_OR_RETURN(json j, ParseObject(body, "the request body"));
  inference::RepositoryIndexRequest request;
  if (auto it = j.find("ready"); it != j.end()) {
    if (!it->is_boolean()) return Invalid("ready: must be true or false");
    request.set_ready(it->get<bool>());
  }
  return request;
}

absl::StatusOr<inference::RepositoryModelLoadRequest> ParseLoadRequest(absl::string_view body,
                                                                       const std::string& model) {
  KILN_ASSIGN_OR_RETURN(json j, ParseObject(body, "the request body"));
  inference::RepositoryModelLoadRequest request;
  request.set_model_name(model);
  if (auto it = j.find("parameters"); it != j.end()) {
    if (!it->is_object()) return Invalid("parameters: must be an object");
    for (const auto& [key, v] : it->items()) {
      inference::ModelRepositoryParameter& p = (*request.mutable_parameters())[key];
      if (v.is_string()) {
        p.set_string_param(v.get<std::string>());
      } else if (v.is_boolean()) {
        p.set_bool_param(v.get<bool>());
      } else if (v.is_number_integer() &&
                 !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX})) {
        p.set_int64_param(v.get<int64_t>());
      } else {
        return Invalid(absl::StrCat("parameters.", key, ": must be a string, integer or bool"));
      }
    }
  }
  return request;
}

absl::StatusOr<inference::RepositoryModelUnloadRequest> ParseUnloadRequest(
    absl::string_view body, const std::string& model) {
  KILN_ASSIGN_OR_RETURN(inference::RepositoryModelLoadRequest load, ParseLoadRequest(body, model));
  inference::RepositoryModelUnloadRequest request;
  request.set_model_name(model);
  *request.mutable_parameters() = load.parameters();
  return request;
}

}  // namespace kiln::serving
