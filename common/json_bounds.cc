#include "common/json_bounds.h"

#include "absl/strings/str_cat.h"

namespace kiln {

absl::Status CheckJsonDepth(absl::string_view text, absl::string_view what, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, whatever it is, cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return absl::InvalidArgumentError(absl::StrCat(what,
                                                       " nests arrays and objects deeper than ",
                                                       max_depth, " levels (at byte ", i, ")"));
      }
    } else if (c == ']' || c == '}') {
      if (depth > 0) --depth;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<nlohmann::json> ParseJsonWithin(absl::string_view text, absl::string_view what,
                                               int max_depth) {
  if (absl::Status depth = CheckJsonDepth(text, what, max_depth); !depth.ok()) return depth;
  nlohmann::json value =
      nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (!value.is_discarded()) return value;
  // Parse again with exceptions only to name the position for the client.
  try {
    nlohmann::json again = nlohmann::json::parse(text.begin(), text.end());
    (void)again;
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON: ", e.what()));
  }
  return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON"));
}

std::string JsonPreview(const nlohmann::json& value) {
  if (value.is_array()) {
    return absl::StrCat("an array of ", value.size(), value.size() == 1 ? " element" : " elements");
  }
  if (value.is_object()) {
    return absl::StrCat("an object of ", value.size(), value.size() == 1 ? " member" : " members");
  }
  // Scalars are flat; a string may still be long (only its start is copied), and may hold
  // invalid UTF-8 (replaced).
  constexpr size_t kMaxPreview = 64;
  if (value.is_string()) {
    const std::string& s = value.get_ref<const std::string&>();
    if (s.size() > kMaxPreview) {
      size_t cut = kMaxPreview;
      while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
      return absl::StrCat(nlohmann::json(s.substr(0, cut))
                              .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                          "... (", s.size(), " bytes)");
    }
  }
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace kiln
