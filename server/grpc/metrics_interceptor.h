// Feeds Metrics::RecordGrpc (kiln_grpc_requests_total, kiln_grpc_request_duration_seconds) from
// a server interceptor: every finished call of every service on the server, with its method,
// final code and duration.
#pragma once

#include <memory>

#include "server/observability/metrics.h"

namespace grpc::experimental {
class ServerInterceptorFactoryInterface;
}

namespace kiln::server {

// An interceptor factory for grpc::ServerBuilder::experimental().SetInterceptorCreators.
// `metrics` must outlive the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewGrpcMetricsInterceptor(
    Metrics* metrics);

}  // namespace kiln::server
