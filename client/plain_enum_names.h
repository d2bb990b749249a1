// Plain enum names: "adamw" for OptimizerSpec.KIND_ADAMW, "one_cycle" for
// ScheduleSpec.KIND_ONE_CYCLE, "on_demand" for CHECKPOINT_KIND_ON_DEMAND. The one spelling kiln
// shows an enum value in, and what spec files and flags may say instead of the full name.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/descriptor.h"
#include "nlohmann/json.hpp"

namespace kiln::client {

// The value's name without the prefix all its enum's values share, lower-case: "adamw".
std::string PlainEnumName(const google::protobuf::EnumValueDescriptor* value);

// The value `text` names: its full name, any case of its plain name ("cosine" is KIND_COSINE,
// not KIND_WARMUP_COSINE), or any case of a suffix that ends exactly one value's name after a
// '_' ("adamw", "ADAMW", "kind_adamw"). Otherwise a usage error naming `what` and the plain names
// accepted.
absl::StatusOr<const google::protobuf::EnumValueDescriptor*> ParsePlainEnumName(
    const google::protobuf::EnumDescriptor* type, const std::string& text, const std::string& what);

// Replaces plain enum names in `json` (the proto3 JSON form of a `type` message) with full ones,
// in every enum field of every nested message, repeated field and map; `path` names `json` in
// errors ("spec" gives "spec.optimizer.kind: ..."). Unknown fields are left for the JSON parser.
absl::Status ExpandPlainEnumNames(const google::protobuf::Descriptor* type, const std::string& path,
                                  nlohmann::json* json);

}  // namespace kiln::client
