// How a kiln command failed, and the exit code and message each kind of failure gets.
#pragma once

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace kiln::client {

// Exit codes: kOk; kRefused when the server said no or the job failed; kUsage for bad usage;
// kInterrupted when Ctrl-C detached from a watch.
enum class ExitCode { kOk = 0, kRefused = 1, kUsage = 2, kInterrupted = 130 };

// A usage mistake the user can fix on the command line (exit 2).
absl::Status UsageError(absl::string_view message);
// The server's answer to a failed call, kept as given (exit 1, printed "CODE_NAME: message").
absl::Status ServerError(const grpc::Status& status);
// A failure already reported to the user (exit 1, nothing more printed).
absl::Status ReportedFailure();
// Ctrl-C detached from a watch; already reported (exit 130).
absl::Status Interrupted();

// Prints `status` to `err` as its kind wants (nothing when OK or already reported) and returns
// the process exit code. Other errors are local failures (exit 1, printed "kiln: message").
int ReportStatus(const absl::Status& status, std::FILE* err);

}  // namespace kiln::client
