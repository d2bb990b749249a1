#include "server/grpc/auth_interceptor.h"

#include <grpc/grpc.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/server_interceptor.h>

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "server/grpc/call_auth.h"

namespace kiln::server {
namespace {

using grpc::experimental::InterceptionHookPoints;

constexpr absl::string_view kBearerScheme = "bearer ";
constexpr absl::string_view kHealthPrefix = "/grpc.health.v1.Health/";
constexpr absl::string_view kWorkersPrefix = "/kiln.v1.Workers/";

// Decides each call at its initial metadata. A rejected call is cancelled with UNAUTHENTICATED
// at once (which reaches the client as the call's status, also for services without a check of
// their own such as reflection, whose reads and writes then fail), and its handler is told
// through the verdict key; its final status is rewritten so later interceptors record it.
class BearerAuthInterceptor : public grpc::experimental::Interceptor {
 public:
  BearerAuthInterceptor(grpc::experimental::ServerRpcInfo* info, const AuthTokens* tokens,
                        const AuthFailureCallback* on_failure)
      : info_(info), tokens_(tokens), on_failure_(on_failure) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      Decide(*methods->GetRecvInitialMetadata());
    }
    if (rejection_.has_value() &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      methods->ModifySendStatus(*rejection_);
    }
    methods->Proceed();
  }

 private:
  void Decide(std::multimap<grpc::string_ref, grpc::string_ref>& metadata) {
    // Whatever a client sent under our keys must not pass for our verdict.
    for (const char* key : kAuthKeys) metadata.erase(key);
    const char* method = info_->method();
    if (method != nullptr && absl::StartsWith(method, kHealthPrefix)) return;
    // Workers present their job's worker token instead, which the Workers service checks.
    if (method != nullptr && absl::StartsWith(method, kWorkersPrefix)) return;

    std::vector<std::string_view> values;
    const auto [begin, end] = metadata.equal_range("authorization");
    for (auto it = begin; it != end; ++it) {
      values.emplace_back(it->second.data(), it->second.size());
    }
    const AuthOutcome outcome = CheckAuthorization(values, *tokens_, &caller_);
    if (outcome == AuthOutcome::kAccepted) {
      // The metadata holds references: the values live as long as this interceptor (the call).
      role_ = std::string(RoleName(caller_.role));
      metadata.emplace(kAuthVerdictKey, kAuthVerdictAccepted);
      metadata.emplace(kAuthUserKey, caller_.user);
      metadata.emplace(kAuthTeamKey, caller_.team);
      metadata.emplace(kAuthRoleKey, role_);
      return;
    }
    const bool missing = outcome == AuthOutcome::kMissing;
    metadata.emplace(kAuthVerdictKey, missing ? kAuthVerdictMissing : kAuthVerdictInvalid);
    const char* message = missing ? kMissingBearerTokenMessage : kInvalidBearerTokenMessage;
    rejection_ = grpc::Status(grpc::StatusCode::UNAUTHENTICATED, message);
    if (*on_failure_) (*on_failure_)(AuthFailureReason(outcome));
    grpc_call_cancel_with_status(info_->server_context()->c_call(), GRPC_STATUS_UNAUTHENTICATED,
                                 message, nullptr);
  }

  grpc::experimental::ServerRpcInfo* const info_;
  const AuthTokens* const tokens_;
  const AuthFailureCallback* const on_failure_;
  std::optional<grpc::Status> rejection_;
  Caller caller_;
  std::string role_;
};

class BearerAuthInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  BearerAuthInterceptorFactory(const AuthTokens* tokens, AuthFailureCallback on_failure)
      : tokens_(tokens), on_failure_(std::move(on_failure)) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new BearerAuthInterceptor(info, tokens_, &on_failure_);
  }

 private:
  const AuthTokens* const tokens_;
  const AuthFailureCallback on_failure_;
};

}  // namespace

AuthOutcome CheckAuthorization(const std::vector<std::string_view>& values,
                               const AuthTokens& tokens, Caller* caller) {
  AuthOutcome outcome = AuthOutcome::kMissing;
  for (std::string_view value : values) {
    const absl::string_view v(value.data(), value.size());
    if (v.size() < kBearerScheme.size() ||
        !absl::EqualsIgnoreCase(v.substr(0, kBearerScheme.size()), kBearerScheme)) {
      if (!absl::StripAsciiWhitespace(v).empty()) outcome = AuthOutcome::kInvalid;
      continue;
    }
    const absl::string_view token = absl::StripAsciiWhitespace(v.substr(kBearerScheme.size()));
    if (token.empty()) continue;
    if (std::optional<Caller> found = tokens.Find(std::string_view(token.data(), token.size()))) {
      *caller = *std::move(found);
      return AuthOutcome::kAccepted;
    }
    outcome = AuthOutcome::kInvalid;
  }
  return outcome;
}

std::string_view AuthFailureReason(AuthOutcome outcome) {
  return outcome == AuthOutcome::kMissing ? "missing" : "invalid";
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewBearerAuthInterceptor(
    const AuthTokens* tokens, AuthFailureCallback on_failure) {
  return std::make_unique<BearerAuthInterceptorFactory>(tokens, std::move(on_failure));
}

}  // namespace kiln::server
