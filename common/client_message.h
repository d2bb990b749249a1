// The message a client is shown for a status, whichever protocol carries it: server paths shown
// by their folder names (shown_paths.h), and at most 1 KiB, since messages can echo what a client
// sent (a name, a path) and gRPC carries them in a header with a size limit (8 KiB by default:
// past it the client would get "metadata size exceeds limit" instead of the error). Longer
// messages keep their start, cut on a UTF-8 boundary.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace kiln {

inline constexpr size_t kMaxClientMessageBytes = 1024;

std::string ClientMessage(std::string_view message);
inline std::string ClientMessage(const absl::Status& status) {
  return ClientMessage(std::string_view(status.message().data(), status.message().size()));
}

}  // namespace kiln
