#include "engine/data/utf8.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kiln {

bool DecodeUtf8(std::string_view text, size_t pos, char32_t* code_point, int* length) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t b0 = byte(pos);
  if (b0 < 0x80) {
    *code_point = b0;
    *length = 1;
    return true;
  }
  int n = 0;
  char32_t cp = 0;
  char32_t least = 0;  // the smallest code point of this length: below it is an overlong form
  if ((b0 & 0xE0) == 0xC0) {
    n = 2, cp = b0 & 0x1F, least = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, cp = b0 & 0x0F, least = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, cp = b0 & 0x07, least = 0x10000;
  } else {
    return false;  // a continuation byte where a character starts, or 0xF8..0xFF
  }
  if (text.size() - pos < static_cast<size_t>(n)) return false;
  for (int i = 1; i < n; ++i) {
    const uint8_t b = byte(pos + i);
    if ((b & 0xC0) != 0x80) return false;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < least || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
  *code_point = cp;
  *length = n;
  return true;
}

size_t FindInvalidUtf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    // ASCII runs are most of most corpora: skip them without decoding.
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    char32_t cp = 0;
    int len = 0;
    if (!DecodeUtf8(text, pos, &cp, &len)) return pos;
    pos += static_cast<size_t>(len);
  }
  return std::string_view::npos;
}

absl::Status CheckUtf8(std::string_view text, absl::string_view what) {
  const size_t bad = FindInvalidUtf8(text);
  if (bad == std::string_view::npos) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: not valid UTF-8 at byte offset %d (byte 0x%02X)", what, bad,
                      static_cast<uint8_t>(text[bad])));
}

namespace {

// The length a UTF-8 lead byte announces, or 0 when it cannot start a character.
int SequenceLength(uint8_t lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 0;
}

}  // namespace

absl::Status Utf8StreamCheck::Consume(std::string_view bytes) {
  // Complete the character the last piece cut, then check the rest but a cut tail.
  if (!pending_.empty()) {
    const size_t want = static_cast<size_t>(SequenceLength(static_cast<uint8_t>(pending_[0])));
    const size_t take = std::min(want - pending_.size(), bytes.size());
    pending_.append(bytes.data(), take);
    bytes.remove_prefix(take);
    if (pending_.size() < want) return absl::OkStatus();
    char32_t cp = 0;
    int len = 0;
    if (!DecodeUtf8(pending_, 0, &cp, &len)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: not valid UTF-8 at byte offset %d (byte 0x%02X)", name_, offset_,
                          static_cast<uint8_t>(pending_[0])));
    }
    offset_ += static_cast<int64_t>(pending_.size());
    pending_.clear();
  }
  // A tail shorter than its lead byte announces waits for the next piece.
  size_t keep = 0;
  for (size_t back = 1; back <= std::min<size_t>(3, bytes.size()); ++back) {
    const auto b = static_cast<uint8_t>(bytes[bytes.size() - back]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const int n = SequenceLength(b);
    if (n > 1 && static_cast<size_t>(n) > back) keep = back;
    break;
  }
  const std::string_view whole = bytes.substr(0, bytes.size() - keep);
  if (const size_t bad = FindInvalidUtf8(whole); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: not valid UTF-8 at byte offset %d (byte 0x%02X)", name_,
                        offset_ + static_cast<int64_t>(bad), static_cast<uint8_t>(whole[bad])));
  }
  offset_ += static_cast<int64_t>(whole.size());
  pending_.assign(bytes.data() + whole.size(), keep);
  return absl::OkStatus();
}

absl::Status Utf8StreamCheck::Finish() const {
  if (pending_.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("%s: not valid UTF-8 at byte offset %d (byte 0x%02X): the text ends inside "
                      "a character",
                      name_, offset_, static_cast<uint8_t>(pending_[0])));
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string CodePointName(char32_t cp) {
  return absl::StrFormat("U+%04X", static_cast<uint32_t>(cp));
}

}  // namespace kiln
