// The one mapping from absl::Status to an HTTP answer, for every route on kilnd's HTTP port
// (KServe v2 REST and the web page's API): a status code for the canonical code, and the message
// as a client is shown it (common/client_message.h) in {"error": ...}. The gRPC edge's twin is
// server/grpc/status_mapping.h.
#pragma once

#include <httplib.h>

#include "absl/status/status.h"

namespace kiln::http {

// 400 for a bad request, 404 for an unknown model or version, 401, 409, 429, 503 (a model being
// unloaded, a server shutting down), 501, 504; 500 for the rest.
int HttpStatusOf(absl::StatusCode code);

// Answers `res` with the status's HTTP code and {"error": its client message}.
void ReplyStatus(httplib::Response& res, const absl::Status& status);

}  // namespace kiln::http
