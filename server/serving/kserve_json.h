// KServe v2 REST bodies (JSON, and the binary tensor data extension) to and from the inference
// protocol's messages, so that a REST call runs the very code a gRPC call does. No HTTP here:
// bodies in, messages out, and back. Errors are InvalidArgument naming the field at fault.
#pragma once

#include <cstddef>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "inference/grpc_service.pb.h"

namespace kiln::serving {

// An infer request as ModelInfer takes it, and which outputs the client wants as binary data.
struct RestInferRequest {
  inference::ModelInferRequest request;
  bool all_outputs_binary = false;       // parameters.binary_data_output
  std::set<std::string> binary_outputs;  // outputs[i].parameters.binary_data
  bool binary_input = false;             // some input came as binary data
};

// Parses an inference request body for `model` (and `version`, empty: the server chooses).
// `json_size`: the Inference-Header-Content-Length header (binary tensor data extension): the
// first json_size bytes are the JSON, then each input with parameters.binary_data_size takes
// that many bytes, in input order (they become raw_input_contents). Without it the body is JSON
// alone and every input carries "data" (flat or nested arrays, row-major).
absl::StatusOr<RestInferRequest> ParseInferRequest(absl::string_view body,
                                                   std::optional<size_t> json_size,
                                                   const std::string& model,
                                                   const std::string& version);

// A response body; `json_size` set when binary tensor data follows the JSON (then it is the
// Inference-Header-Content-Length header's value).
struct RestBody {
  std::string body;
  std::optional<size_t> json_size;
};

// The inference response: outputs as "data" (flat, row-major), or as binary data appended
// after the JSON for the outputs the request asked so (with parameters.binary_data_size).
RestBody WriteInferResponse(const inference::ModelInferResponse& response,
                            const RestInferRequest& request);

std::string ServerMetadataJson(const inference::ServerMetadataResponse& metadata);
std::string ModelMetadataJson(const inference::ModelMetadataResponse& metadata);
// The repository index: [{"name","version","state","reason"}, ...].
std::string RepositoryIndexJson(const inference::RepositoryIndexResponse& index);

// {"ready": bool} (optional; an empty body is {}).
absl::StatusOr<inference::RepositoryIndexRequest> ParseIndexRequest(absl::string_view body);
// {"parameters": {"checkpoint": "JOB@best", "max_batch_size": 8, ...}} (optional): string,
// integer and bool values become the matching ModelRepositoryParameter.
absl::StatusOr<inference::RepositoryModelLoadRequest> ParseLoadRequest(absl::string_view body,
                                                                       const std::string& model);
absl::StatusOr<inference::RepositoryModelUnloadRequest> ParseUnloadRequest(
    absl::string_view body, const std::string& model);

}  // namespace kiln::serving
