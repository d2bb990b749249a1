#include "server/serving/token_codec.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/serving/tensor_codec.h"

namespace kiln::serving {
namespace {

absl::Status Invalid(const std::string& who, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(who, ": ", what));
}

// Reads element i of a typed or raw INT64/INT32 tensor.
int64_t IdAt(const inference::ModelInferRequest::InferInputTensor& in, const std::string* raw,
             bool is_i64, int64_t i) {
  if (raw != nullptr) {
    if (is_i64) {
      int64_t v;
      std::memcpy(&v, raw->data() + i * 8, 8);
      return v;
    }
    int32_t v;
    std::memcpy(&v, raw->data() + i * 4, 4);
    return v;
  }
  return is_i64 ? in.contents().int64_contents(static_cast<int>(i))
                : in.contents().int_contents(static_cast<int>(i));
}

}  // namespace

absl::StatusOr<TokenInput> DecodeTokenInput(const inference::ModelInferRequest& request,
                                            int64_t context, int64_t token_ids) {
  if (request.inputs_size() != 1 || request.inputs(0).name() != kInputName) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model takes one input, \"", kInputName,
                     "\" (INT64 or INT32 token ids [batch, length])"));
  }
  for (const auto& out : request.outputs()) {
    if (out.name() != kLogitsOutput) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown output \"", out.name(), "\"; the model's output is \"", kLogitsOutput, "\""));
    }
  }
  const auto& in = request.inputs(0);
  const std::string who = absl::StrCat("input \"", in.name(), "\"");
  const bool is_i64 = in.datatype() == "INT64";
  if (!is_i64 && in.datatype() != "INT32") {
    return Invalid(who, absl::StrCat("datatype \"", in.datatype(),
                                     "\" is not accepted: a language model takes token ids, "
                                     "INT64 or INT32"));
  }
  const std::string shape = absl::StrCat("[", absl::StrJoin(in.shape(), ","), "]");
  if (in.shape_size() != 2 || in.shape(0) < 1 || in.shape(1) < 1) {
    return Invalid(who, absl::StrCat("shape ", shape, " is not [batch, length] with both >= 1"));
  }
  const int64_t batch = in.shape(0), length = in.shape(1);
  if (length > context) {
    return Invalid(who, absl::StrCat("shape ", shape, ": ", length,
                                     " positions is more than the model's context of ", context));
  }
  if (batch > (int64_t{1} << 24))
    return Invalid(who, absl::StrCat("shape ", shape, " is too large"));
  const int64_t n = batch * length;
  const std::string* raw = nullptr;
  if (request.raw_input_contents_size() > 0) {
    raw = &request.raw_input_contents(0);
    const int64_t want = n * (is_i64 ? 8 : 4);
    if (static_cast<int64_t>(raw->size()) != want) {
      return Invalid(who, absl::StrCat("raw contents hold ", raw->size(), " bytes; shape ", shape,
                                       " of ", in.datatype(), " needs ", want));
    }
  } else {
    const int64_t have =
        is_i64 ? in.contents().int64_contents_size() : in.contents().int_contents_size();
    if (have != n) {
      return Invalid(who, absl::StrCat(have, " ", is_i64 ? "int64_contents" : "int_contents",
                                       " elements; shape ", shape, " needs ", n));
    }
  }
  TokenInput input;
  input.batch = batch;
  input.length = length;
  input.ids.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = IdAt(in, raw, is_i64, i);
    if (id < 0 || id >= token_ids) {
      return Invalid(who, absl::StrCat("token id ", id, " at [", i / length, ",", i % length,
                                       "] is outside the vocabulary [0, ", token_ids, ")"));
    }
    input.ids[static_cast<size_t>(i)] = static_cast<int32_t>(id);
  }
  return input;
}

char* PrepareLogits(int64_t batch, int64_t vocab, bool raw,
                    inference::ModelInferResponse* response) {
  auto* out = response->add_outputs();
  out->set_name(kLogitsOutput);
  out->set_datatype("FP32");
  out->add_shape(batch);
  out->add_shape(vocab);
  const size_t n = static_cast<size_t>(batch * vocab);
  if (raw) {
    std::string* bytes = response->add_raw_output_contents();
    bytes->resize(n * sizeof(float));
    return bytes->data();
  }
  auto* floats = out->mutable_contents()->mutable_fp32_contents();
  floats->Resize(static_cast<int>(n), 0.0f);
  return reinterpret_cast<char*>(floats->mutable_data());
}

}  // namespace kiln::serving
