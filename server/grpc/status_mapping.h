// The one mapping from absl::Status, which everything inside kilnd returns, to grpc::Status, which
// the services send: absl and gRPC share the canonical code numbering, and the message passes
// unchanged up to 1 KiB (longer ones, echoing a client's huge input, keep their start). Used by
// every service at the edge (kiln.v1.Training and the KServe v2 front end).
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace kiln::server {

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace kiln::server
