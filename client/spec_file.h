// Job specs from files (SPEC.json in the proto3 JSON mapping, SPEC.textproto in text format) and
// the command-line overrides of `kiln submit`.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "kiln/v1/model_spec.pb.h"

namespace kiln::client {

// Reads a JobSpec from `path`: *.json as JSON, *.textproto/*.txtpb/*.pbtxt/*.prototxt as text
// format, anything else by its first non-blank character ('{' means JSON). Parse errors are
// InvalidArgument naming the file and, where the parser says, the line.
absl::StatusOr<v1::JobSpec> ReadSpecFile(const std::string& path);
// Parses spec text in the given syntax; `source` names it in errors.
absl::StatusOr<v1::JobSpec> ParseSpecJson(const std::string& text, const std::string& source);
absl::StatusOr<v1::JobSpec> ParseSpecText(const std::string& text, const std::string& source);

// Flags of `kiln submit` that change the spec; unset ones leave it alone.
struct SpecOverrides {
  std::string preset;
  std::string dataset;
  std::optional<int> epochs;
  std::optional<int> batch_size;
  std::optional<double> lr;
  std::string device;
  std::optional<uint64_t> seed;
};

// Applies `o` to `spec`. The dataset defaults to "mnist" and the epochs to 1 when neither the
// spec nor the flags give them. --lr on a preset without an explicit optimizer spells out the
// preset's optimizer (kilnd takes a partial optimizer as a whole one), so only the rate changes.
absl::Status ApplyOverrides(const SpecOverrides& o, v1::JobSpec* spec);

}  // namespace kiln::client
