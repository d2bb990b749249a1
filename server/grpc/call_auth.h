// How a service handler learns who is calling, or that the bearer-token interceptor
// (auth_interceptor.h) refused the call. gRPC 1.51's server interceptors cannot end a call before
// its handler runs, so the interceptor rejects the call on the wire and records its verdict, and
// for an accepted token the caller's user, team and role, in the call's metadata under keys of
// its own (dropping whatever a client sent under them); every handler of kiln.v1.Training and
// inference.GRPCInferenceService asks CallerOf first and does nothing else when it is not OK.
// Header-only, so kiln_serving needs no link to kiln_server.
#pragma once

#include <grpcpp/server_context.h>

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/access/caller.h"

namespace kiln::server {

inline constexpr char kAuthVerdictKey[] = "kiln-auth-verdict";
inline constexpr char kAuthUserKey[] = "kiln-auth-user";
inline constexpr char kAuthTeamKey[] = "kiln-auth-team";
inline constexpr char kAuthRoleKey[] = "kiln-auth-role";
inline constexpr const char* kAuthKeys[] = {kAuthVerdictKey, kAuthUserKey, kAuthTeamKey,
                                            kAuthRoleKey};
inline constexpr char kAuthVerdictMissing[] = "missing";
inline constexpr char kAuthVerdictInvalid[] = "invalid";
inline constexpr char kAuthVerdictAccepted[] = "accepted";

inline constexpr char kMissingBearerTokenMessage[] = "missing bearer token";
inline constexpr char kInvalidBearerTokenMessage[] = "invalid bearer token";

// Who the call's token names (its verdict accepted), or Caller::Unchecked() when the server
// checks no tokens (no verdict recorded). Otherwise UNAUTHENTICATED, saying whether the token was
// missing or wrong.
inline absl::StatusOr<Caller> CallerOf(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  const auto verdict = metadata.find(kAuthVerdictKey);
  if (verdict == metadata.end()) return Caller::Unchecked();
  if (verdict->second != kAuthVerdictAccepted) {
    return absl::UnauthenticatedError(verdict->second == kAuthVerdictMissing
                                          ? kMissingBearerTokenMessage
                                          : kInvalidBearerTokenMessage);
  }
  auto value = [&metadata](const char* key) {
    const auto it = metadata.find(key);
    return it == metadata.end() ? std::string() : std::string(it->second.data(), it->second.size());
  };
  Caller caller;
  caller.user = value(kAuthUserKey);
  caller.team = value(kAuthTeamKey);
  const std::optional<Role> role = RoleNamed(value(kAuthRoleKey));
  // Only the interceptor writes these keys; a verdict without a role would be kilnd's own bug.
  if (!role) return absl::InternalError("the call's verdict names no role");
  caller.role = *role;
  return caller;
}

// OK when the call may proceed at all (CallerOf is).
inline absl::Status CallAuthStatus(const grpc::ServerContextBase& context) {
  return CallerOf(context).status();
}

}  // namespace kiln::server
