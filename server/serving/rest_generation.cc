#include "server/serving/rest_generation.h"

#include <httplib.h>

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/http/status_mapping.h"

namespace kiln::serving {

using http::Access;
using http::ReplyStatus;
using nlohmann::json;
namespace {

constexpr char kModelPath[] = R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)";

absl::Status Invalid(const std::string& what) { return absl::InvalidArgumentError(what); }

absl::StatusOr<int64_t> IntField(const json& v, const std::string& name) {
  if (!v.is_number_integer())
    return Invalid(absl::StrCat("parameters.", name, ": must be an integer"));
  return v.get<int64_t>();
}

absl::Status ParseParameters(const json& p, GenerationParams* params) {
  if (!p.is_object()) return Invalid("parameters: must be an object");
  for (const auto& [key, v] : p.items()) {
    if (key == "max_tokens") {
      absl::StatusOr<int64_t> n = IntField(v, key);
      if (!n.ok()) return n.status();
      params->max_tokens = *n;
    } else if (key == "top_k") {
      absl::StatusOr<int64_t> n = IntField(v, key);
      if (!n.ok()) return n.status();
      params->top_k = *n;
    } else if (key == "seed") {
      if (!v.is_number_unsigned()) {
        return Invalid("parameters.seed: must be an integer >= 0");
      }
      params->seed = v.get<uint64_t>();
    } else if (key == "temperature") {
      if (!v.is_number()) return Invalid("parameters.temperature: must be a number");
      params->temperature = v.get<double>();
    } else {
      return Invalid(absl::StrCat(
          "parameters.", key, ": unknown; kilnd reads max_tokens, temperature, top_k and seed"));
    }
  }
  return absl::OkStatus();
}

std::string VersionOf(const httplib::Request& req) {
  return req.matches.size() > 2 ? std::string(req.matches[2]) : std::string();
}

// The answer's JSON: text_output with a vocabulary, output_ids without.
json Answer(const Generation& g, const std::string& text, const std::vector<int32_t>& ids) {
  json out = {{"model_name", g.version().model()}, {"model_version", g.version().version()}};
  if (g.has_vocabulary()) {
    out["text_output"] = text;
  } else {
    out["output_ids"] = ids;
  }
  return out;
}

std::string DataEvent(const json& data) {
  return absl::StrCat("data: ", data.dump(-1, ' ', false, json::error_handler_t::replace), "\n\n");
}

// Parses and starts a generation, or answers the error and returns null.
std::unique_ptr<Generation> Begin(GenerationService* service, const httplib::Request& req,
                                  httplib::Response& res, const server::Caller& caller) {
  absl::StatusOr<GenerationCall> call =
      ParseGenerateRequest(req.body, req.matches[1], VersionOf(req));
  absl::StatusOr<std::unique_ptr<Generation>> g =
      call.ok() ? service->Start(caller, *call)
                : absl::StatusOr<std::unique_ptr<Generation>>(call.status());
  if (!g.ok()) {
    ReplyStatus(res, g.status());
    return nullptr;
  }
  return std::move(*g);
}

void Generate(GenerationService* service, const httplib::Request& req, httplib::Response& res,
              const server::Caller& caller) {
  std::unique_ptr<Generation> g = Begin(service, req, res, caller);
  if (g == nullptr) return;
  absl::StatusOr<GenerationResult> result = g->Run(nullptr);
  if (!result.ok()) {
    ReplyStatus(res, result.status());
    return;
  }
  res.set_content(
      Answer(*g, result->text, result->ids).dump(-1, ' ', false, json::error_handler_t::replace),
      "application/json");
}

// Streams on the HTTP thread that answers: the generation runs inside the body's one turn,
// writing each token's event as it is chosen and stopping when the client has gone.
void GenerateStream(GenerationService* service, const httplib::Request& req, httplib::Response& res,
                    const server::Caller& caller) {
  std::shared_ptr<Generation> g = Begin(service, req, res, caller);
  if (g == nullptr) return;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider("text/event-stream", [g](size_t, httplib::DataSink& sink) {
    try {
      auto on_token = [&](const GeneratedToken& token) {
        const std::string event = DataEvent(Answer(*g, token.text, {token.id}));
        return sink.is_writable() && sink.write(event.data(), event.size());
      };
      absl::StatusOr<GenerationResult> result = g->Run(on_token);
      if (!result.ok()) {
        const std::string event = DataEvent({{"error", std::string(result.status().message())}});
        if (sink.is_writable()) sink.write(event.data(), event.size());
      }
      sink.done();
      return true;
    } catch (...) {
      return false;
    }
  });
}

}  // namespace

absl::StatusOr<GenerationCall> ParseGenerateRequest(const std::string& body,
                                                    const std::string& model,
                                                    const std::string& version) {
  json doc = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return Invalid("the body is not a JSON object");
  GenerationCall call;
  call.model = model;
  call.version = version;
  for (const auto& [key, v] : doc.items()) {
    if (key == "text_input") {
      if (!v.is_string()) return Invalid("text_input: must be a string");
      call.text_input = v.get<std::string>();
    } else if (key == "input_ids") {
      if (!v.is_array()) return Invalid("input_ids: must be a list of token ids");
      call.input_ids.emplace();
      for (size_t i = 0; i < v.size(); ++i) {
        if (!v[i].is_number_integer()) {
          return Invalid(absl::StrCat("input_ids[", i, "]: must be an integer"));
        }
        call.input_ids->push_back(v[i].get<int64_t>());
      }
    } else if (key == "parameters") {
      if (absl::Status s = ParseParameters(v, &call.params); !s.ok()) return s;
    } else if (key != "id") {
      return Invalid(absl::StrCat(key,
                                  ": unknown field; kilnd reads text_input, input_ids and "
                                  "parameters"));
    }
  }
  return call;
}

void AddGenerationRoutes(GenerationService* service, http::HttpServer* server) {
  server->Post(absl::StrCat(kModelPath, "/generate"), Access::kToken,
               [service](const httplib::Request& req, httplib::Response& res,
                         const server::Caller& caller) { Generate(service, req, res, caller); });
  server->Post(
      absl::StrCat(kModelPath, "/generate_stream"), Access::kToken,
      [service](const httplib::Request& req, httplib::Response& res, const server::Caller& caller) {
        GenerateStream(service, req, res, caller);
      });
}

}  // namespace kiln::serving
