#include "engine/data/char_vocabulary.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json_bounds.h"
#include "common/status_macros.h"
#include "engine/data/utf8.h"
#include "nlohmann/json.hpp"

namespace kiln {
namespace {

// How an error shows a character: itself when printable, and always its code point.
std::string ShowCharacter(char32_t c) {
  if (c < 0x20 || c == 0x7F) return CodePointName(c);
  std::string s = "'";
  AppendUtf8(c, &s);
  return absl::StrCat(s, "' (", CodePointName(c), ")");
}

}  // namespace

absl::StatusOr<CharVocabulary> CharVocabulary::FromText(std::string_view text,
                                                        absl::string_view what) {
  KILN_RETURN_IF_ERROR(CheckUtf8(text, what));
  // ASCII is marked in a table; other characters are collected, then sorted and made unique.
  bool ascii[128] = {};
  std::vector<char32_t> others;
  size_t pos = 0;
  while (pos < text.size()) {
    char32_t c = 0;
    int len = 0;
    DecodeUtf8(text, pos, &c, &len);  // valid: checked above
    if (c < 128) {
      ascii[c] = true;
    } else {
      others.push_back(c);
      if (others.size() > (size_t{1} << 20)) {
        std::sort(others.begin(), others.end());
        others.erase(std::unique(others.begin(), others.end()), others.end());
      }
    }
    pos += static_cast<size_t>(len);
  }
  for (char32_t c = 0; c < 128; ++c) {
    if (ascii[c]) others.push_back(c);
  }
  return FromCharacters(std::move(others), what);
}

absl::StatusOr<CharVocabulary> CharVocabulary::FromCharacters(std::vector<char32_t> characters,
                                                              absl::string_view what) {
  std::sort(characters.begin(), characters.end());
  characters.erase(std::unique(characters.begin(), characters.end()), characters.end());
  if (characters.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no text (an empty corpus)"));
  }
  if (characters.size() > static_cast<size_t>(kMaxCharVocabulary)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", characters.size(), " distinct characters; a vocabulary holds at most ",
        kMaxCharVocabulary, " (token ids are uint16)"));
  }
  for (char32_t c : characters) {
    if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", CodePointName(c), " is not a Unicode scalar value"));
    }
  }
  return CharVocabulary(std::move(characters));
}

absl::StatusOr<CharVocabulary> CharVocabulary::FromJson(std::string_view json,
                                                        absl::string_view what) {
  KILN_ASSIGN_OR_RETURN(nlohmann::json j,
                        ParseJsonWithin(absl::string_view(json.data(), json.size()), what));
  const auto invalid = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", why));
  };
  if (!j.is_array()) return invalid("a vocabulary is a JSON list of one-character strings");
  if (j.empty()) return invalid("the vocabulary is empty");
  if (j.size() > static_cast<size_t>(kMaxCharVocabulary)) {
    return invalid(absl::StrCat(j.size(), " characters; at most ", kMaxCharVocabulary));
  }
  std::vector<char32_t> chars;
  chars.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string* s = j[i].get_ptr<const std::string*>();
    char32_t c = 0;
    int len = 0;
    if (s == nullptr || s->empty() || !DecodeUtf8(*s, 0, &c, &len) ||
        static_cast<size_t>(len) != s->size()) {
      return invalid(absl::StrCat("entry ", i, " is not a string of one character"));
    }
    if (!chars.empty() && c <= chars.back()) {
      return invalid(absl::StrCat("entry ", i, " (", CodePointName(c), ") does not follow entry ",
                                  i - 1, " (", CodePointName(chars.back()),
                                  "): the list must be sorted"));
    }
    chars.push_back(c);
  }
  return CharVocabulary(std::move(chars));
}

std::string CharVocabulary::ToJson() const {
  nlohmann::json j = nlohmann::json::array();
  for (char32_t c : chars_) {
    std::string s;
    AppendUtf8(c, &s);
    j.push_back(std::move(s));
  }
  // Valid UTF-8 by construction, so dump never throws; characters stay readable (no \u escapes).
  return j.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace) + "\n";
}

int32_t CharVocabulary::IdOf(char32_t c) const {
  auto it = std::lower_bound(chars_.begin(), chars_.end(), c);
  if (it == chars_.end() || *it != c) return -1;
  return static_cast<int32_t>(it - chars_.begin());
}

absl::StatusOr<std::vector<int32_t>> CharVocabulary::Encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    char32_t c = 0;
    int len = 0;
    if (!DecodeUtf8(text, pos, &c, &len)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("text is not valid UTF-8 at byte offset %d (byte 0x%02X)", pos,
                          static_cast<uint8_t>(text[pos])));
    }
    const int32_t id = IdOf(c);
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("character ", ShowCharacter(c), " at byte offset ", pos, " (character ",
                       ids.size(), ") is not in the vocabulary of ", size(), " characters"));
    }
    ids.push_back(id);
    pos += static_cast<size_t>(len);
  }
  return ids;
}

absl::StatusOr<std::string> CharVocabulary::Decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "id ", ids[i], " at position ", i, " is outside the vocabulary [0, ", size(), ")"));
    }
    AppendUtf8(chars_[static_cast<size_t>(ids[i])], &out);
  }
  return out;
}

}  // namespace kiln
