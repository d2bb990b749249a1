// The route of a request path for the HTTP metrics' `route` label, from a fixed set that every
// route on kilnd's HTTP port folds into (KServe v2 REST, /metrics, the web page and its API), so
// that a client choosing paths cannot grow the label's cardinality.
#pragma once

#include <string>

namespace kiln::http {

// "/metrics", "/v2/health/live", "/v2/models/{model}/infer" (a version in the path folds into
// it), the web page's "/", "/web/{file}" and "/api/jobs/{job}/events", ...; "other" otherwise.
std::string RouteLabel(const std::string& path);

}  // namespace kiln::http
