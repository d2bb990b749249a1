#include "server/serving/tensor_codec.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln::serving {
namespace {

// Bounds every element count computed from a client's shape, so products cannot overflow.
constexpr int64_t kMaxElements = int64_t{1} << 40;

std::string ShapeText(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

bool HasTypedContents(const inference::InferTensorContents& c) {
  return c.bool_contents_size() > 0 || c.int_contents_size() > 0 || c.int64_contents_size() > 0 ||
         c.uint_contents_size() > 0 || c.uint64_contents_size() > 0 || c.fp32_contents_size() > 0 ||
         c.fp64_contents_size() > 0 || c.bytes_contents_size() > 0;
}

// The index of the first element that is not finite, or -1. `data` may be unaligned.
int64_t FirstNonFinite(const char* data, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float x;
    std::memcpy(&x, data + i * sizeof(float), sizeof(float));
    if (!std::isfinite(x)) return i;
  }
  return -1;
}

}  // namespace

absl::StatusOr<PixelInput> DecodeInput(const inference::ModelInferRequest& request,
                                       int64_t sample_elems) {
  if (request.inputs_size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("the model takes one input, \"", kInputName,
                                                   "\"; the request has ", request.inputs_size()));
  }
  const inference::ModelInferRequest::InferInputTensor& in = request.inputs(0);
  if (in.name() != kInputName) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown input \"", in.name(), "\"; the model's input is \"", kInputName, "\""));
  }
  const std::string who = absl::StrCat("input \"", in.name(), "\"");
  const bool is_u8 = in.datatype() == "UINT8";
  if (!is_u8 && in.datatype() != "FP32") {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": datatype \"", in.datatype(),
                     "\" is not accepted; send FP32 (pixels in [0, 1]) or UINT8 (pixels 0..255)"));
  }

  const std::string shape = ShapeText(in.shape());
  if (in.shape_size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": shape ", shape, " has no batch dimension; send [batch, ", sample_elems,
                     "] or [batch] followed by the model's input shape"));
  }
  int64_t per_sample = 1;
  for (int i = 0; i < in.shape_size(); ++i) {
    const int64_t d = in.shape(i);
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": shape ", shape, " has a negative dimension"));
    }
    if (i == 0) continue;
    if (d != 0 && per_sample > kMaxElements / d) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": shape ", shape, " is too large"));
    }
    per_sample *= d;
  }
  const int64_t batch = in.shape(0);
  if (batch == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": shape ", shape, " has batch dimension 0; send at least one sample"));
  }
  if (per_sample != sample_elems) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": shape ", shape, " holds ", per_sample,
                                                   " elements per sample; the model takes ",
                                                   sample_elems));
  }
  if (batch > kMaxElements / per_sample) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": shape ", shape, " is too large"));
  }
  const int64_t total = batch * per_sample;

  const bool raw = request.raw_input_contents_size() > 0;
  const bool typed = HasTypedContents(in.contents());
  if (raw && typed) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": data given both in contents and in raw_input_contents; send one of them"));
  }
  PixelInput out;
  out.samples = batch;
  if (raw) {
    if (request.raw_input_contents_size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat("raw_input_contents has ",
                                                     request.raw_input_contents_size(),
                                                     " entries; the request has 1 input"));
    }
    const std::string& bytes = request.raw_input_contents(0);
    const int64_t elem_bytes = is_u8 ? 1 : static_cast<int64_t>(sizeof(float));
    if (static_cast<int64_t>(bytes.size()) != total * elem_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": raw_input_contents holds ",
                                                     bytes.size(), " bytes; shape ", shape, " of ",
                                                     in.datatype(), " needs ", total * elem_bytes));
    }
    out.data = bytes.data();
    out.encoding = is_u8 ? PixelEncoding::kU8 : PixelEncoding::kF32;
    if (!is_u8) {
      if (int64_t bad = FirstNonFinite(bytes.data(), total); bad >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(who, ": element ", bad, " is not a finite number"));
      }
    }
    return out;
  }
  if (!typed) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": no data; send contents.",
                                                   is_u8 ? "uint_contents" : "fp32_contents",
                                                   " or raw_input_contents"));
  }
  if (is_u8) {
    const auto& values = in.contents().uint_contents();
    if (values.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": UINT8 elements go in contents.uint_contents"));
    }
    if (values.size() != total) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": shape ", shape, " needs ", total,
                                                     " elements; contents.uint_contents has ",
                                                     values.size()));
    }
    for (int64_t i = 0; i < total; ++i) {
      if (values[i] > 255) {
        return absl::InvalidArgumentError(
            absl::StrCat(who, ": element ", i, " is ", values[i], ", outside 0..255 for UINT8"));
      }
    }
    out.encoding = PixelEncoding::kU32;
    out.data = values.data();
    return out;
  }
  const auto& values = in.contents().fp32_contents();
  if (values.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": FP32 elements go in contents.fp32_contents"));
  }
  if (values.size() != total) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": shape ", shape, " needs ", total,
                                                   " elements; contents.fp32_contents has ",
                                                   values.size()));
  }
  if (int64_t bad = FirstNonFinite(reinterpret_cast<const char*>(values.data()), total); bad >= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": element ", bad, " is not a finite number"));
  }
  out.encoding = PixelEncoding::kF32;
  out.data = values.data();
  return out;
}

absl::StatusOr<OutputSelection> SelectOutputs(const inference::ModelInferRequest& request) {
  OutputSelection selection;
  if (request.outputs_size() == 0) return selection;
  selection.count = 0;
  for (const auto& requested : request.outputs()) {
    OutputKind kind;
    if (requested.name() == kProbabilitiesOutput) {
      kind = OutputKind::kProbabilities;
    } else if (requested.name() == kClassOutput) {
      kind = OutputKind::kClass;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown output \"", requested.name(), "\"; the model's outputs are \"",
                       kProbabilitiesOutput, "\" and \"", kClassOutput, "\""));
    }
    for (int j = 0; j < selection.count; ++j) {
      if (selection.kinds[j] == kind) {
        return absl::InvalidArgumentError(
            absl::StrCat("output \"", requested.name(), "\" is asked for twice"));
      }
    }
    selection.kinds[selection.count++] = kind;
  }
  return selection;
}

OutputBuffers PrepareOutputs(const OutputSelection& outputs, int64_t samples, int64_t classes,
                             ContentsForm form, inference::ModelInferResponse* response) {
  OutputBuffers buffers;
  for (int i = 0; i < outputs.count; ++i) {
    const bool probs = outputs.kinds[i] == OutputKind::kProbabilities;
    inference::ModelInferResponse::InferOutputTensor* out = response->add_outputs();
    out->set_name(probs ? kProbabilitiesOutput : kClassOutput);
    out->set_datatype(probs ? "FP32" : "INT64");
    out->add_shape(samples);
    if (probs) out->add_shape(classes);
    const int64_t n = probs ? samples * classes : samples;
    char* where;
    if (form == ContentsForm::kRaw) {
      std::string* raw = response->add_raw_output_contents();
      raw->resize(n * (probs ? sizeof(float) : sizeof(int64_t)));
      where = raw->data();
    } else if (probs) {
      auto* values = out->mutable_contents()->mutable_fp32_contents();
      values->Resize(static_cast<int>(n), 0.0f);
      where = reinterpret_cast<char*>(values->mutable_data());
    } else {
      auto* values = out->mutable_contents()->mutable_int64_contents();
      values->Resize(static_cast<int>(n), 0);
      where = reinterpret_cast<char*>(values->mutable_data());
    }
    (probs ? buffers.probabilities : buffers.classes) = where;
  }
  return buffers;
}

}  // namespace kiln::serving
