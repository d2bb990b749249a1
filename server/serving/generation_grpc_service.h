// kiln.v1.GenerationService over gRPC's sync API: a thin translator from GenerateRequest to
// serving::GenerationService and back, one GenerateResponse per token. Each call holds a gRPC
// thread while it generates; GenerationService's --max_generations bounds how many do.
#pragma once

#include "kiln/v1/generation.grpc.pb.h"
#include "server/serving/generation_service.h"

namespace kiln::serving {

class GenerationGrpcService final : public kiln::v1::GenerationService::Service {
 public:
  // `service` must outlive this (and the grpc::Server it is registered on).
  explicit GenerationGrpcService(GenerationService* service) : service_(service) {}

  // Checks the bearer token (server/grpc/call_auth.h) first; stops when the call is cancelled
  // or a write fails.
  grpc::Status Generate(grpc::ServerContext* context, const kiln::v1::GenerateRequest* request,
                        grpc::ServerWriter<kiln::v1::GenerateResponse>* writer) override;

 private:
  GenerationService* service_;
};

}  // namespace kiln::serving
