#include "server/jobs/job_labels.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace kiln::server {
namespace {

bool AllOf(absl::string_view text, absl::string_view extra) {
  for (char c : text) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) &&
        extra.find(c) == absl::string_view::npos) {
      return false;
    }
  }
  return true;
}

absl::Status Invalid(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

// The key as it appears in a field path, quoted and cut short so a hostile key cannot flood the
// message.
std::string KeyField(const std::string& key) {
  std::string shown = key.substr(0, kMaxLabelKeyLength);
  for (char& c : shown) {
    if (!absl::ascii_isprint(static_cast<unsigned char>(c))) c = '?';
  }
  return absl::StrCat("spec.labels[\"", shown, key.size() > shown.size() ? "..." : "", "\"]");
}

}  // namespace

absl::Status ValidateNameAndLabels(const v1::JobSpec& spec) {
  const std::string& name = spec.name();
  if (static_cast<int>(name.size()) > kMaxJobNameLength) {
    return Invalid("spec.name",
                   absl::StrCat("at most ", kMaxJobNameLength, " characters, got ", name.size()));
  }
  if (!AllOf(name, " -_.:/")) {
    return Invalid("spec.name", "only letters, digits, spaces and \"-_.:/\" are allowed");
  }
  if (!name.empty() && (name.front() == ' ' || name.back() == ' ')) {
    return Invalid("spec.name", "must not start or end with a space");
  }
  if (spec.labels_size() > kMaxLabels) {
    return Invalid("spec.labels",
                   absl::StrCat("at most ", kMaxLabels, " labels, got ", spec.labels_size()));
  }
  for (const auto& [key, value] : spec.labels()) {
    if (key.empty() || static_cast<int>(key.size()) > kMaxLabelKeyLength) {
      return Invalid(KeyField(key), absl::StrCat("a key has 1..", kMaxLabelKeyLength,
                                                 " characters, got ", key.size()));
    }
    if (!absl::ascii_isalnum(static_cast<unsigned char>(key.front())) || !AllOf(key, "-_./")) {
      return Invalid(KeyField(key),
                     "a key is letters, digits and \"-_./\", starting with a letter or digit");
    }
    if (static_cast<int>(value.size()) > kMaxLabelValueLength) {
      return Invalid(KeyField(key), absl::StrCat("a value has at most ", kMaxLabelValueLength,
                                                 " characters, got ", value.size()));
    }
    if (!AllOf(value, "-_./:")) {
      return Invalid(KeyField(key), "a value is letters, digits and \"-_./:\"");
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln::server
