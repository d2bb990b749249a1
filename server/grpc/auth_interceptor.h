// Bearer-token authentication for every gRPC call but health checks: a server interceptor that
// reads "authorization: Bearer TOKEN", rejects calls without an accepted token with
// UNAUTHENTICATED ("missing bearer token" / "invalid bearer token") and tells the handlers (see
// call_auth.h). Works with and without TLS, unlike gRPC's AuthMetadataProcessor.
#pragma once

#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "server/access/auth_tokens.h"

namespace grpc::experimental {
class ServerInterceptorFactoryInterface;
}

namespace kiln::server {

enum class AuthOutcome { kAccepted, kMissing, kInvalid };

// What the "authorization" metadata values of one call amount to: kAccepted when one of them is
// "Bearer T" (scheme in any case) with T accepted by `tokens`, and then `*caller` is who T names;
// kMissing when there is none or its token is empty; kInvalid otherwise (a wrong token, or
// another scheme).
AuthOutcome CheckAuthorization(const std::vector<std::string_view>& values,
                               const AuthTokens& tokens, Caller* caller);

// "missing" or "invalid": the `reason` label of kiln_auth_failures_total.
std::string_view AuthFailureReason(AuthOutcome outcome);

// Called once per rejected call with AuthFailureReason of it; must be thread-safe.
using AuthFailureCallback = std::function<void(std::string_view reason)>;

// An interceptor factory for grpc::ServerBuilder::experimental().SetInterceptorCreators. Register
// it before other interceptors, so that they see the rejected calls' final status. `tokens` must
// outlive the server; grpc.health.v1.Health stays open.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewBearerAuthInterceptor(
    const AuthTokens* tokens, AuthFailureCallback on_failure);

}  // namespace kiln::server
