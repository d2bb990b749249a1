// How a service handler learns whether the bearer-token interceptor (auth_interceptor.h) let its
// call through. gRPC 1.51's server interceptors cannot end a call before its handler runs, so
// the interceptor rejects the call on the wire and records its verdict in the call's metadata
// under a key of its own (dropping whatever a client sent under that key); every handler of
// kiln.v1.Training and inference.GRPCInferenceService asks CallAuthStatus first and does
// nothing else when it is not OK. Header-only, so kiln_serving needs no link to kiln_server.
#pragma once

#include <grpcpp/server_context.h>

#include "absl/status/status.h"

namespace kiln::server {

inline constexpr char kAuthVerdictKey[] = "kiln-auth-verdict";
inline constexpr char kAuthVerdictMissing[] = "missing";
inline constexpr char kAuthVerdictInvalid[] = "invalid";
inline constexpr char kAuthVerdictAccepted[] = "accepted";

inline constexpr char kMissingBearerTokenMessage[] = "missing bearer token";
inline constexpr char kInvalidBearerTokenMessage[] = "invalid bearer token";

// OK when the call may proceed: its token was accepted, or the server checks no tokens (no
// verdict recorded). Otherwise UNAUTHENTICATED, saying whether the token was missing or wrong.
inline absl::Status CallAuthStatus(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  const auto verdict = metadata.find(kAuthVerdictKey);
  if (verdict == metadata.end() || verdict->second == kAuthVerdictAccepted) {
    return absl::OkStatus();
  }
  return absl::UnauthenticatedError(verdict->second == kAuthVerdictMissing
                                        ? kMissingBearerTokenMessage
                                        : kInvalidBearerTokenMessage);
}

}  // namespace kiln::server
