// JSON from clients, read and quoted within bounds: nesting is checked on the text before a
// parser builds a tree (nlohmann's dump() and the trees' users recurse, so a body nested 80,000
// deep would overflow the stack), and a client's value is quoted in an error message only as a
// short preview, never serialised whole.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace kiln {

// The deepest nesting of arrays and objects any JSON kiln reads may have: a KServe v2 infer body
// is 4 levels plus its tensor's rank (at most 32), a job spec is less.
inline constexpr int kMaxJsonDepth = 64;

// InvalidArgument naming `what` and the byte offset where `text` nests arrays and objects deeper
// than `max_depth`; OK otherwise, also for text that is not JSON (the parser says what is wrong
// with it). Reads the text once, building nothing.
absl::Status CheckJsonDepth(absl::string_view text, absl::string_view what,
                            int max_depth = kMaxJsonDepth);

// Parses `text` as one JSON value after CheckJsonDepth; an error names `what` and where the text
// broke. Never throws.
absl::StatusOr<nlohmann::json> ParseJsonWithin(absl::string_view text, absl::string_view what,
                                               int max_depth = kMaxJsonDepth);

// A value as an error message may quote it: a scalar as JSON, cut at 64 bytes; an array or an
// object by its kind and size ("an array of 3 elements"), never its contents.
std::string JsonPreview(const nlohmann::json& value);

}  // namespace kiln
