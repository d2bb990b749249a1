#include "server/serving/rest_inference.h"

#include <httplib.h>

#include <optional>
#include <regex>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/http/status_mapping.h"
#include "server/serving/kserve_json.h"

namespace kiln::serving {

using http::Access;
using http::HttpServer;
using http::ReplyError;
using http::ReplyStatus;
namespace {

constexpr char kJson[] = "application/json";
// A model name, then optionally /versions/VERSION; httplib hands the path over decoded.
constexpr char kModelPath[] = R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)";

std::string VersionOf(const httplib::Request& req) {
  return req.matches.size() > 2 ? std::string(req.matches[2]) : std::string();
}

void Infer(InferenceService* service, const httplib::Request& req, httplib::Response& res,
           const server::Caller& caller) {
  std::optional<size_t> json_size;
  if (req.has_header("Inference-Header-Content-Length")) {
    size_t n;
    if (!absl::SimpleAtoi(req.get_header_value("Inference-Header-Content-Length"), &n)) {
      ReplyError(res, 400, "Inference-Header-Content-Length: must be a byte count");
      return;
    }
    json_size = n;
  }
  absl::StatusOr<RestInferRequest> request =
      ParseInferRequest(req.body, json_size, req.matches[1], VersionOf(req));
  if (!request.ok()) {
    ReplyStatus(res, request.status());
    return;
  }
  inference::ModelInferResponse response;
  if (absl::Status status = service->InferCounted(caller, request->request, &response);
      !status.ok()) {
    ReplyStatus(res, status);
    return;
  }
  RestBody body = WriteInferResponse(response, *request);
  if (body.json_size.has_value()) {
    res.set_header("Inference-Header-Content-Length", std::to_string(*body.json_size));
    res.set_content(body.body, "application/octet-stream");
  } else {
    res.set_content(body.body, kJson);
  }
}

}  // namespace

void AddKServeRoutes(InferenceService* service, HttpServer* server) {
  // Health answers by status alone (200, or 400 for "no"), with an empty body.
  server->Get("/v2/health/live", Access::kOpen,
              [](const httplib::Request&, httplib::Response& res, const server::Caller&) {
                res.status = 200;
              });
  server->Get("/v2/health/ready", Access::kOpen,
              [service](const httplib::Request&, httplib::Response& res, const server::Caller&) {
                res.status = service->Ready() ? 200 : 400;
              });
  server->Get("/v2/?", Access::kToken,
              [service](const httplib::Request&, httplib::Response& res, const server::Caller&) {
                inference::ServerMetadataResponse metadata;
                service->ServerInfo(&metadata);
                res.set_content(ServerMetadataJson(metadata), kJson);
              });
  server->Get(
      absl::StrCat(kModelPath, "/ready"), Access::kToken,
      [service](const httplib::Request& req, httplib::Response& res, const server::Caller& caller) {
        absl::StatusOr<bool> ready = service->ModelIsReady(caller, req.matches[1], VersionOf(req));
        if (!ready.ok()) {
          ReplyStatus(res, ready.status());
          return;
        }
        res.status = *ready ? 200 : 400;
      });
  server->Get(
      kModelPath, Access::kToken,
      [service](const httplib::Request& req, httplib::Response& res, const server::Caller& caller) {
        inference::ModelMetadataRequest request;
        request.set_name(req.matches[1]);
        request.set_version(VersionOf(req));
        inference::ModelMetadataResponse metadata;
        if (absl::Status s = service->Metadata(caller, request, &metadata); !s.ok()) {
          ReplyStatus(res, s);
          return;
        }
        res.set_content(ModelMetadataJson(metadata), kJson);
      });
  server->Post(absl::StrCat(kModelPath, "/infer"), Access::kToken,
               [service](const httplib::Request& req, httplib::Response& res,
                         const server::Caller& caller) { Infer(service, req, res, caller); });
  // The repository extension, as Triton serves it over HTTP.
  server->Post(
      "/v2/repository/index", Access::kToken,
      [service](const httplib::Request& req, httplib::Response& res, const server::Caller& caller) {
        absl::StatusOr<inference::RepositoryIndexRequest> request = ParseIndexRequest(req.body);
        if (!request.ok()) {
          ReplyStatus(res, request.status());
          return;
        }
        inference::RepositoryIndexResponse index;
        service->Index(caller, *request, &index);
        res.set_content(RepositoryIndexJson(index), kJson);
      });
  server->Post(
      R"(/v2/repository/models/([^/]+)/load)", Access::kToken,
      [service](const httplib::Request& req, httplib::Response& res, const server::Caller& caller) {
        absl::StatusOr<inference::RepositoryModelLoadRequest> request =
            ParseLoadRequest(req.body, req.matches[1]);
        absl::Status s = request.ok() ? service->LoadAnnounced(caller, *request) : request.status();
        if (!s.ok()) {
          ReplyStatus(res, s);
          return;
        }
        res.status = 200;
      });
  server->Post(
      R"(/v2/repository/models/([^/]+)/unload)", Access::kToken,
      [service](const httplib::Request& req, httplib::Response& res, const server::Caller& caller) {
        absl::StatusOr<inference::RepositoryModelUnloadRequest> request =
            ParseUnloadRequest(req.body, req.matches[1]);
        absl::Status s =
            request.ok() ? service->UnloadAnnounced(caller, *request) : request.status();
        if (!s.ok()) {
          ReplyStatus(res, s);
          return;
        }
        res.status = 200;
      });
}

}  // namespace kiln::serving
