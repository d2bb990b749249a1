// The KServe v2 REST API on kilnd's HTTP listener: health, server and model metadata, model
// readiness, infer (JSON tensors, and the binary tensor data extension) and the model-repository
// extension. Each route calls the serving::InferenceService method its gRPC twin calls, so both
// protocols answer alike; errors carry the gRPC path's message as {"error": ...} with an HTTP
// status for its code (HttpStatusOf).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "server/http/http_server.h"
#include "server/serving/inference_service.h"

namespace kiln::http {

// Adds the routes; `service` must outlive `server`. /v2/health/live and /v2/health/ready stay
// open (as grpc.health.v1 does), every other /v2 route needs a token when tokens are on.
void AddKServeRoutes(serving::InferenceService* service, HttpServer* server);

// The route of a path for metrics labels, from a fixed set: "/metrics", "/v2/health/live",
// "/v2/models/{model}/infer" (a version in the path folds into it), the web page's "/",
// "/web/{file}" and "/api/jobs/{job}/events", ...; "other" otherwise.
std::string RouteLabel(const std::string& path);

// 400 for a bad request, 404 for an unknown model or version, 401, 409, 429, 503 (a model being
// unloaded, a server shutting down), 501, 504; 500 for the rest.
int HttpStatusOf(absl::StatusCode code);

}  // namespace kiln::http
