// KServe v2 tensors to and from kiln's pixel batches: checks and views a request's input tensor,
// and lays out the requested output tensors of a response, typed or raw.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "inference/grpc_service.pb.h"

namespace kiln::serving {

// The tensor names every served model uses.
inline constexpr char kInputName[] = "input";
inline constexpr char kProbabilitiesOutput[] = "probabilities";  // FP32 [batch, classes]
inline constexpr char kClassOutput[] = "class";                  // INT64 [batch]

// How a request's pixels lie in its message.
enum class PixelEncoding {
  kU8,   // UINT8 in raw_input_contents: one byte per pixel, 0..255
  kU32,  // UINT8 in contents.uint_contents: one uint32 per pixel, checked to be 0..255
  kF32,  // FP32, typed or raw (raw bytes may be unaligned): finite, pixels scaled to [0, 1]
};

// A request's input as the batcher reads it: `samples` x sample_elems elements at `data`, which
// points into the request message and is valid while the message is.
struct PixelInput {
  PixelEncoding encoding = PixelEncoding::kU8;
  const void* data = nullptr;
  int64_t samples = 0;
};

// Checks the request's one input against a model whose samples have `sample_elems` elements:
// its name, datatype (UINT8 or FP32), shape (batch first, then anything holding sample_elems
// elements), element count or raw byte size, and values (UINT8 in range, FP32 finite). Errors
// are InvalidArgument naming the input and what was wrong.
absl::StatusOr<PixelInput> DecodeInput(const inference::ModelInferRequest& request,
                                       int64_t sample_elems);

enum class OutputKind { kProbabilities, kClass };

// The outputs to answer, in the order asked for; both (probabilities, then class) when the
// request names none.
struct OutputSelection {
  OutputKind kinds[2] = {OutputKind::kProbabilities, OutputKind::kClass};
  int count = 2;
};

// InvalidArgument for an unknown or repeated output name.
absl::StatusOr<OutputSelection> SelectOutputs(const inference::ModelInferRequest& request);

// Where a request's answers go: float32 [samples, classes] and int64 [samples], each null when
// not asked for. Byte pointers, because raw outputs need not be aligned: write with memcpy.
struct OutputBuffers {
  char* probabilities = nullptr;
  char* classes = nullptr;
};

// Typed contents answer typed inputs; raw_output_contents answer raw_input_contents.
enum class ContentsForm { kTyped, kRaw };

// Adds the selected output tensors (name, datatype, shape) to `response`, sizes their storage in
// `form`, and returns where their elements go. Valid until `response` is next changed.
OutputBuffers PrepareOutputs(const OutputSelection& outputs, int64_t samples, int64_t classes,
                             ContentsForm form, inference::ModelInferResponse* response);

}  // namespace kiln::serving
