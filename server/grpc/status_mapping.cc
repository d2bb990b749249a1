#include "server/grpc/status_mapping.h"

#include "common/client_message.h"

namespace kiln::server {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), ClientMessage(status));
}

}  // namespace kiln::server
