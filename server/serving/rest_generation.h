// Triton's generate extension on kilnd's HTTP listener, for language models:
// POST /v2/models/NAME[/versions/V]/generate answers the whole text at once, and
// .../generate_stream answers server-sent events, one per token. Both call
// serving::GenerationService, as the gRPC GenerationService does; errors before the first token as
// the other REST errors
// ({"error": ...} with 400, 404, 429, 503, ...), after it as a last `data: {"error": ...}` event.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "server/http/http_server.h"
#include "server/serving/generation_service.h"

namespace kiln::serving {

// The body {"text_input": "..." | "input_ids": [..], "parameters": {"max_tokens", "temperature",
// "top_k", "seed"}} as a call to `model` `version`. InvalidArgument naming the field at fault
// (an unknown field or parameter too).
absl::StatusOr<GenerationCall> ParseGenerateRequest(const std::string& body,
                                                    const std::string& model,
                                                    const std::string& version);

// Adds the two routes (token access); `service` must outlive `server`.
void AddGenerationRoutes(GenerationService* service, http::HttpServer* server);

}  // namespace kiln::serving
