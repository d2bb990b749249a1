#include "server/serving/generation_grpc_service.h"

#include <memory>
#include <utility>

#include "server/grpc/call_auth.h"
#include "server/grpc/status_mapping.h"

namespace kiln::serving {
namespace {

GenerationCall CallOf(const kiln::v1::GenerateRequest& request) {
  GenerationCall call;
  call.model = request.model_name();
  call.version = request.model_version();
  if (request.has_input_ids()) {
    call.input_ids.emplace(request.input_ids().ids().begin(), request.input_ids().ids().end());
  } else {
    // No prompt at all is an empty text, which the prompt check refuses by name.
    call.text_input = request.text_input();
  }
  const kiln::v1::GenerationParameters& p = request.parameters();
  if (p.max_tokens() != 0) call.params.max_tokens = p.max_tokens();
  call.params.temperature = p.temperature();
  call.params.top_k = p.top_k();
  call.params.seed = p.seed();
  return call;
}

}  // namespace

grpc::Status GenerationGrpcService::Generate(
    grpc::ServerContext* context, const kiln::v1::GenerateRequest* request,
    grpc::ServerWriter<kiln::v1::GenerateResponse>* writer) {
  absl::StatusOr<server::Caller> caller = server::CallerOf(*context);
  if (!caller.ok()) return server::ToGrpcStatus(caller.status());
  absl::StatusOr<std::unique_ptr<Generation>> g = service_->Start(*caller, CallOf(*request));
  if (!g.ok()) return server::ToGrpcStatus(g.status());
  // Each token is written once the next is known (or generation ended), so that the last
  // response can carry the finish reason.
  std::unique_ptr<kiln::v1::GenerateResponse> pending;
  bool written = true;
  auto flush = [&] {
    if (pending != nullptr) written = written && writer->Write(*pending);
    pending.reset();
    return written && !context->IsCancelled();
  };
  absl::StatusOr<GenerationResult> result = (*g)->Run([&](const GeneratedToken& token) {
    if (!flush()) return false;
    pending = std::make_unique<kiln::v1::GenerateResponse>();
    pending->set_model_name((*g)->version().model());
    pending->set_model_version((*g)->version().version());
    pending->set_text_output(token.text);
    pending->set_token_id(token.id);
    return true;
  });
  if (!result.ok()) return server::ToGrpcStatus(result.status());
  if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  if (pending != nullptr) {
    pending->set_finish_reason(result->finish_reason);
    flush();
  }
  if (!written) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the client stopped reading");
  return grpc::Status::OK;
}

}  // namespace kiln::serving
