// A character-level vocabulary as nanoGPT's shakespeare_char/prepare.py builds one: the sorted set
// of the Unicode code points a corpus holds, a character's id being its place in that order.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln {

// Ids fit the uint16 tokens of llm.c shards.
inline constexpr int32_t kMaxCharVocabulary = 65535;

class CharVocabulary {
 public:
  // The sorted set of `text`'s characters. InvalidArgument naming `what` (a file name) for text
  // that is not valid UTF-8 (with the byte offset), empty, or of more than kMaxCharVocabulary
  // distinct characters.
  static absl::StatusOr<CharVocabulary> FromText(std::string_view text, absl::string_view what);
  // The sorted set of `characters` (repeats allowed); the same limits as FromText.
  static absl::StatusOr<CharVocabulary> FromCharacters(std::vector<char32_t> characters,
                                                       absl::string_view what);
  // Reads what ToJson writes: a JSON list of one-character strings, in id order (strictly
  // increasing code points). Errors name `what` and the entry at fault.
  static absl::StatusOr<CharVocabulary> FromJson(std::string_view json, absl::string_view what);

  // The characters in id order as a JSON list of strings, e.g. ["\n"," ","!","a","é"].
  std::string ToJson() const;
  // One id per character of `text`. InvalidArgument for invalid UTF-8 (byte offset) or a
  // character not in the vocabulary (the character, its byte offset and its character index).
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const;
  // The UTF-8 text of `ids`; InvalidArgument naming the first id outside [0, size()).
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids) const;

  // The id of `c`, or -1 when it is not in the vocabulary.
  int32_t IdOf(char32_t c) const;
  int32_t size() const { return static_cast<int32_t>(chars_.size()); }
  // By id; sorted.
  const std::vector<char32_t>& characters() const { return chars_; }

 private:
  explicit CharVocabulary(std::vector<char32_t> chars) : chars_(std::move(chars)) {}
  std::vector<char32_t> chars_;
};

}  // namespace kiln
