// The one mapping from absl::Status, which everything inside kilnd returns, to grpc::Status, which
// the services send: absl and gRPC share the canonical code numbering, and the message is the
// client's (common/client_message.h). Used by every gRPC service at the edge. The HTTP port's
// twin is server/http/status_mapping.h.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace kiln::server {

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace kiln::server
