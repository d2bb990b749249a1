// Reads a KServe v2 infer request body's JSON without a tree of its tensor data. A SAX handler
// builds the tree of everything else (id, parameters, names, datatypes, shapes, outputs) and packs
// each input's "data" value, however its rows nest, into a compact list of its elements (a binary
// value in the tree: a tag byte each, then a varint for an integer, 8 bytes for a number with a
// fraction or exponent, a string's bytes); UnpackTensorData converts the list to the input's
// typed contents once its datatype is known, since "datatype" may come after "data". A tree
// holds a 16-byte json value per number and a vector per row: a 15 MiB body took up to 23 times
// its size while it was parsed, packed it takes at most 3 (kiln-bench-json, bench/RESULTS.md).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "inference/grpc_service.pb.h"
#include "nlohmann/json.hpp"

namespace kiln::serving {

// Parses `text` as ParseJsonWithin does (CheckJsonDepth first, then the same errors, naming
// `what`), except that in each object of the body's "inputs" array the value of "data" (an array
// nested to any depth, or a single value) is a packed binary value for UnpackTensorData.
// Never throws.
absl::StatusOr<nlohmann::json> ReadInferBody(absl::string_view text, absl::string_view what);

// Adds the elements of a packed "data" value from ReadInferBody, in row-major order, to the
// repeated field of `contents` that `datatype` takes, as KServe v2 JSON carries them: numbers for
// FP32 and FP64, integers within the field's range (uint_contents for UINT8 to UINT32,
// int_contents for INT8 to INT32, int64 and uint64), true and false for BOOL, strings for BYTES.
// A datatype other than these keeps no data (the model's own check names it). An error names
// the element: `data[3]: 1.5 is not a INT32 value`, or `nested deeper than 32 arrays`.
absl::Status UnpackTensorData(const nlohmann::json& packed, const std::string& datatype,
                              inference::InferTensorContents* contents);

}  // namespace kiln::serving
