// Fuzzes ModelInfer's tensor decoding: an inference.ModelInferRequest parsed from the bytes
// (inputs that do not parse are skipped) is decoded for an MNIST model (784 elements a sample),
// its outputs selected, and the response's output tensors laid out.
//
// Oracle: rejections are InvalidArgument; an accepted input's every element is read (so ASan
// sees a short buffer) and is in range for its encoding (UINT8 0..255, FP32 finite); the
// encoding matches the datatype and where the data was sent; every output buffer
// PrepareOutputs hands out is written in full, and the response names and shapes the outputs
// asked for.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inference/grpc_service.pb.h"
#include "server/serving/tensor_codec.h"
#include "tests/fuzz/fuzz_check.h"

namespace kiln::serving {
namespace {

constexpr int64_t kSampleElements = 784;  // 1x28x28
constexpr int64_t kClasses = 10;

void CheckRejection(const absl::Status& status, const char* what) {
  KILN_FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument && !status.message().empty(),
                  "%s: undocumented error %s", what, status.ToString().c_str());
}

void CheckInput(const inference::ModelInferRequest& request, const PixelInput& input) {
  KILN_FUZZ_CHECK(input.samples > 0 && input.data != nullptr, "%lld samples at %p",
                  static_cast<long long>(input.samples), input.data);
  const inference::ModelInferRequest::InferInputTensor& tensor = request.inputs(0);
  const bool raw = request.raw_input_contents_size() > 0;
  const int64_t n = input.samples * kSampleElements;
  switch (input.encoding) {
    case PixelEncoding::kU8: {
      KILN_FUZZ_CHECK(raw && tensor.datatype() == "UINT8", "kU8 for %s %s",
                      tensor.datatype().c_str(), raw ? "raw" : "typed");
      // Any byte is a pixel; reading them all is the check (ASan stops a read past the end).
      const auto* p = static_cast<const uint8_t*>(input.data);
      uint8_t x = 0;
      for (int64_t i = 0; i < n; ++i) x ^= p[i];
      const volatile uint8_t sink = x;
      (void)sink;
      break;
    }
    case PixelEncoding::kU32: {
      KILN_FUZZ_CHECK(!raw && tensor.datatype() == "UINT8", "kU32 for %s %s",
                      tensor.datatype().c_str(), raw ? "raw" : "typed");
      const auto* p = static_cast<const uint32_t*>(input.data);
      for (int64_t i = 0; i < n; ++i) {
        KILN_FUZZ_CHECK(p[i] <= 255, "element %lld is %u", static_cast<long long>(i), p[i]);
      }
      break;
    }
    case PixelEncoding::kF32: {
      KILN_FUZZ_CHECK(tensor.datatype() == "FP32", "kF32 for %s", tensor.datatype().c_str());
      const auto* p = static_cast<const char*>(input.data);
      for (int64_t i = 0; i < n; ++i) {
        float x;
        std::memcpy(&x, p + i * sizeof(float), sizeof(float));  // raw bytes may be unaligned
        KILN_FUZZ_CHECK(std::isfinite(x), "element %lld is %g", static_cast<long long>(i), x);
      }
      break;
    }
  }
}

void CheckOutputs(const OutputSelection& selection, int64_t samples, ContentsForm form) {
  inference::ModelInferResponse response;
  const OutputBuffers buffers = PrepareOutputs(selection, samples, kClasses, form, &response);
  KILN_FUZZ_CHECK(response.outputs_size() == selection.count, "%d outputs for %d asked",
                  response.outputs_size(), selection.count);
  KILN_FUZZ_CHECK(
      (form == ContentsForm::kRaw ? selection.count : 0) == response.raw_output_contents_size(),
      "%d raw outputs", response.raw_output_contents_size());
  bool want_probabilities = false, want_classes = false;
  for (int i = 0; i < selection.count; ++i) {
    const bool probabilities = selection.kinds[i] == OutputKind::kProbabilities;
    (probabilities ? want_probabilities : want_classes) = true;
    const auto& out = response.outputs(i);
    KILN_FUZZ_CHECK(out.name() == (probabilities ? kProbabilitiesOutput : kClassOutput),
                    "output %d is \"%s\"", i, out.name().c_str());
    KILN_FUZZ_CHECK(out.shape_size() == (probabilities ? 2 : 1) && out.shape(0) == samples,
                    "output \"%s\" has %d dims", out.name().c_str(), out.shape_size());
  }
  KILN_FUZZ_CHECK((buffers.probabilities != nullptr) == want_probabilities &&
                      (buffers.classes != nullptr) == want_classes,
                  "buffers do not match the selection");
  // Writing every element is what the batcher does; ASan checks each buffer holds them.
  if (buffers.probabilities != nullptr) {
    std::memset(buffers.probabilities, 0x3f, samples * kClasses * sizeof(float));
  }
  if (buffers.classes != nullptr) std::memset(buffers.classes, 0x01, samples * sizeof(int64_t));
}

}  // namespace
}  // namespace kiln::serving

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace serving = kiln::serving;
  inference::ModelInferRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  const absl::StatusOr<serving::PixelInput> input =
      serving::DecodeInput(request, serving::kSampleElements);
  if (!input.ok()) {
    serving::CheckRejection(input.status(), "DecodeInput");
  } else {
    serving::CheckInput(request, *input);
  }
  const absl::StatusOr<serving::OutputSelection> selection = serving::SelectOutputs(request);
  if (!selection.ok()) {
    serving::CheckRejection(selection.status(), "SelectOutputs");
    return 0;
  }
  KILN_FUZZ_CHECK(selection->count >= 1 && selection->count <= 2, "%d outputs selected",
                  selection->count);
  if (input.ok()) {
    const bool raw = request.raw_input_contents_size() > 0;
    serving::CheckOutputs(*selection, input->samples,
                          raw ? serving::ContentsForm::kRaw : serving::ContentsForm::kTyped);
  }
  return 0;
}
