#include "client/cli_status.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace kiln::client {
namespace {

// The payload that carries a failure's kind.
constexpr absl::string_view kKindUrl = "kiln.dev/client/failure-kind";
constexpr absl::string_view kUsage = "usage";
constexpr absl::string_view kServer = "server";
constexpr absl::string_view kReported = "reported";
constexpr absl::string_view kInterrupted = "interrupted";

absl::Status WithKind(absl::Status status, absl::string_view kind) {
  status.SetPayload(kKindUrl, absl::Cord(kind));
  return status;
}

std::string KindOf(const absl::Status& status) {
  absl::optional<absl::Cord> kind = status.GetPayload(kKindUrl);
  return kind.has_value() ? std::string(*kind) : std::string();
}

}  // namespace

absl::Status UsageError(absl::string_view message) {
  return WithKind(absl::InvalidArgumentError(message), kUsage);
}

absl::Status ServerError(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  std::string message = status.error_message();
  // gRPC answers methods a server lacks with no message at all; say what that means.
  if (message.empty() && status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    message = "this kilnd does not implement the call (a kilnd without serving, or an older one)";
  }
  // kilnd says "missing bearer token" or "invalid bearer token"; say where a token comes from.
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    message = absl::StrCat("kilnd refused the credentials: ",
                           message.empty() ? "no reason given" : message,
                           "; pass --token or set KILN_TOKEN");
  }
  return WithKind(absl::Status(static_cast<absl::StatusCode>(status.error_code()), message),
                  kServer);
}

absl::Status ReportedFailure() { return WithKind(absl::AbortedError("reported"), kReported); }

absl::Status Interrupted() { return WithKind(absl::CancelledError("interrupted"), kInterrupted); }

int ReportStatus(const absl::Status& status, std::FILE* err) {
  if (status.ok()) return static_cast<int>(ExitCode::kOk);
  const std::string kind = KindOf(status);
  const std::string message(status.message());
  if (kind == kUsage) {
    std::fprintf(err, "kiln: %s\nRun with --help for more information.\n", message.c_str());
    return static_cast<int>(ExitCode::kUsage);
  }
  if (kind == kServer) {
    std::fprintf(err, "%s: %s\n", absl::StatusCodeToString(status.code()).c_str(), message.c_str());
    return static_cast<int>(ExitCode::kRefused);
  }
  if (kind == kInterrupted) return static_cast<int>(ExitCode::kInterrupted);
  if (kind != kReported) std::fprintf(err, "kiln: %s\n", message.c_str());
  return static_cast<int>(ExitCode::kRefused);
}

}  // namespace kiln::client
