// The KServe v2 REST API on kilnd's HTTP listener: health, server and model metadata, model
// readiness, infer (JSON tensors, and the binary tensor data extension) and the model-repository
// extension. Each route calls the serving::InferenceService method its gRPC twin calls, so both
// protocols answer alike; errors as server/http/status_mapping.h answers them.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "server/http/http_server.h"
#include "server/serving/inference_service.h"

namespace kiln::serving {

// Adds the routes; `service` must outlive `server`. /v2/health/live and /v2/health/ready stay
// open (as grpc.health.v1 does), every other /v2 route needs a token when tokens are on.
void AddKServeRoutes(InferenceService* service, http::HttpServer* server);

}  // namespace kiln::serving
