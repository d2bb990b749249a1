#include "client/plain_enum_names.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli_status.h"
#include "common/status_macros.h"

namespace kiln::client {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;

// The prefix every value name of `type` starts with, up to and including a '_' ("KIND_",
// "LOSS_KIND_"); empty when they share none.
std::string SharedPrefix(const EnumDescriptor* type) {
  std::string prefix = type->value(0)->name();
  for (int i = 1; i < type->value_count(); ++i) {
    const std::string& name = type->value(i)->name();
    size_t n = 0;
    while (n < prefix.size() && n < name.size() && prefix[n] == name[n]) ++n;
    prefix.resize(n);
  }
  // A shared prefix must leave every name something, and end on a word boundary.
  if (type->value_count() == 1) prefix = type->value(0)->name();
  const size_t underscore = prefix.rfind('_');
  prefix.resize(underscore == std::string::npos ? 0 : underscore + 1);
  return prefix;
}

// "sgd, adam or adamw": the plain names a user may give, UNSPECIFIED values left out.
std::string Accepted(const EnumDescriptor* type) {
  std::vector<std::string> names;
  for (int i = 0; i < type->value_count(); ++i) {
    if (absl::EndsWith(type->value(i)->name(), "_UNSPECIFIED")) continue;
    names.push_back(PlainEnumName(type->value(i)));
  }
  if (names.size() < 2) return absl::StrJoin(names, "");
  const std::string last = names.back();
  names.pop_back();
  return absl::StrCat(absl::StrJoin(names, ", "), " or ", last);
}

// The field a JSON key names: its proto name ("batch_size") or its JSON name ("batchSize").
const FieldDescriptor* FieldByJsonKey(const Descriptor* type, const std::string& key) {
  if (const FieldDescriptor* field = type->FindFieldByName(key)) return field;
  for (int i = 0; i < type->field_count(); ++i) {
    if (type->field(i)->json_name() == key) return type->field(i);
  }
  return nullptr;
}

absl::Status ExpandEnum(const EnumDescriptor* type, const std::string& path, nlohmann::json* v) {
  if (!v->is_string()) return absl::OkStatus();  // numbers and nulls are the parser's business
  KILN_ASSIGN_OR_RETURN(const EnumValueDescriptor* value,
                        ParsePlainEnumName(type, v->get<std::string>(), path));
  *v = value->name();
  return absl::OkStatus();
}

absl::Status ExpandValue(const FieldDescriptor* field, const std::string& path, nlohmann::json* v) {
  if (field->enum_type() != nullptr) return ExpandEnum(field->enum_type(), path, v);
  if (field->message_type() != nullptr) return ExpandPlainEnumNames(field->message_type(), path, v);
  return absl::OkStatus();
}

}  // namespace

std::string PlainEnumName(const EnumValueDescriptor* value) {
  std::string name = value->name();
  const std::string prefix = SharedPrefix(value->type());
  if (absl::StartsWith(name, prefix)) name.erase(0, prefix.size());
  return absl::AsciiStrToLower(name);
}

absl::StatusOr<const EnumValueDescriptor*> ParsePlainEnumName(const EnumDescriptor* type,
                                                              const std::string& text,
                                                              const std::string& what) {
  if (const EnumValueDescriptor* exact = type->FindValueByName(text)) return exact;
  // A value's own plain name wins over suffixes: "cosine" is KIND_COSINE, though it also ends
  // KIND_WARMUP_COSINE, so every name kiln shows parses back to its value.
  const std::string lower = absl::AsciiStrToLower(text);
  for (int i = 0; i < type->value_count(); ++i) {
    if (PlainEnumName(type->value(i)) == lower) return type->value(i);
  }
  const std::string wanted = absl::AsciiStrToUpper(text);
  const EnumValueDescriptor* found = nullptr;
  int matches = 0;
  for (int i = 0; i < type->value_count() && !wanted.empty(); ++i) {
    const std::string& name = type->value(i)->name();
    if (name == wanted || absl::EndsWith(name, absl::StrCat("_", wanted))) {
      found = type->value(i);
      ++matches;
    }
  }
  if (matches == 1) return found;
  return UsageError(
      absl::StrCat(what, ": unknown value \"", text, "\"; expected ", Accepted(type)));
}

absl::Status ExpandPlainEnumNames(const Descriptor* type, const std::string& path,
                                  nlohmann::json* json) {
  // Well-known types (Timestamp, Duration, ...) have JSON forms of their own.
  if (!json->is_object() || absl::StartsWith(type->full_name(), "google.protobuf.")) {
    return absl::OkStatus();
  }
  for (auto& [key, value] : json->items()) {
    const FieldDescriptor* field = FieldByJsonKey(type, key);
    if (field == nullptr) continue;
    const std::string here = absl::StrCat(path, ".", field->name());
    if (field->is_map()) {
      if (!value.is_object()) continue;
      const FieldDescriptor* map_value = field->message_type()->map_value();
      for (auto& [map_key, element] : value.items()) {
        KILN_RETURN_IF_ERROR(
            ExpandValue(map_value, absl::StrCat(here, "[", map_key, "]"), &element));
      }
    } else if (field->is_repeated()) {
      if (!value.is_array()) continue;
      for (size_t i = 0; i < value.size(); ++i) {
        KILN_RETURN_IF_ERROR(ExpandValue(field, absl::StrCat(here, "[", i, "]"), &value[i]));
      }
    } else {
      KILN_RETURN_IF_ERROR(ExpandValue(field, here, &value));
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln::client
