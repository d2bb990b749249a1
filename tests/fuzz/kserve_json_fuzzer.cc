// Fuzzes the KServe v2 REST bodies (server/serving/kserve_json.cc): the bytes as an inference
// request body, without and with a binary part (the first byte, when the body is long enough,
// splits JSON from binary data as Inference-Header-Content-Length would), and as repository
// index, load and unload bodies; an accepted inference request's response is written back.
//
// Oracle: no exception and no crash; rejections are InvalidArgument with a message; an accepted
// request names the model and version asked for, has an input for each "inputs" entry, binary
// data for all of them or none, and its response body's JSON part parses.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "server/serving/kserve_json.h"
#include "tests/fuzz/fuzz_check.h"

namespace kiln::serving {
namespace {

void CheckRejection(const absl::Status& status, const char* what) {
  KILN_FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument && !status.message().empty(),
                  "%s: undocumented error %s", what, status.ToString().c_str());
}

void CheckInfer(absl::string_view body, std::optional<size_t> json_size) {
  absl::StatusOr<RestInferRequest> parsed = ParseInferRequest(body, json_size, "m", "v");
  if (!parsed.ok()) {
    CheckRejection(parsed.status(), "ParseInferRequest");
    return;
  }
  const inference::ModelInferRequest& r = parsed->request;
  KILN_FUZZ_CHECK(r.model_name() == "m" && r.model_version() == "v", "model %s version %s",
                  r.model_name().c_str(), r.model_version().c_str());
  KILN_FUZZ_CHECK(
      r.raw_input_contents_size() == 0 || r.raw_input_contents_size() == r.inputs_size(),
      "%d raw contents for %d inputs", r.raw_input_contents_size(), r.inputs_size());
  KILN_FUZZ_CHECK(parsed->binary_input == (r.raw_input_contents_size() > 0), "binary_input %d",
                  parsed->binary_input);
  // Echo the inputs as outputs, typed, so WriteInferResponse walks every datatype's field.
  inference::ModelInferResponse response;
  response.set_model_name(r.model_name());
  response.set_id(r.id());
  for (const auto& in : r.inputs()) {
    auto* out = response.add_outputs();
    out->set_name(in.name());
    out->set_datatype(in.datatype());
    *out->mutable_shape() = in.shape();
    *out->mutable_contents() = in.contents();
  }
  const RestBody written = WriteInferResponse(response, *parsed);
  const size_t head = written.json_size.value_or(written.body.size());
  KILN_FUZZ_CHECK(head <= written.body.size(), "json_size %zu of %zu", head, written.body.size());
  const nlohmann::json j =
      nlohmann::json::parse(written.body.substr(0, head), nullptr, /*allow_exceptions=*/false);
  KILN_FUZZ_CHECK(j.is_object(), "the response's JSON does not parse: %s",
                  written.body.substr(0, 200).c_str());
}

}  // namespace
}  // namespace kiln::serving

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln::serving;
  const absl::string_view body(reinterpret_cast<const char*>(data), size);
  CheckInfer(body, std::nullopt);
  if (size > 1) CheckInfer(body.substr(1), std::min<size_t>(data[0], size - 1));
  if (auto index = ParseIndexRequest(body); !index.ok()) {
    CheckRejection(index.status(), "ParseIndexRequest");
  }
  if (auto load = ParseLoadRequest(body, "m"); !load.ok()) {
    CheckRejection(load.status(), "ParseLoadRequest");
  }
  if (auto unload = ParseUnloadRequest(body, "m"); !unload.ok()) {
    CheckRejection(unload.status(), "ParseUnloadRequest");
  }
  return 0;
}
