#include "engine/data/utf8.h"

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

absl::Status CheckUtf8(std::string_view text, absl::string_view what) {
  size_t pos = 0;
  while (pos < text.size()) {
    // ASCII runs are most of most corpora: skip them without decoding.
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    char32_t cp = 0;
    int len = 0;
    if (!DecodeUtf8(text, pos, &cp, &len)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: not valid UTF-8 at byte offset %d (byte 0x%02X)", what, pos,
                          static_cast<uint8_t>(text[pos])));
    }
    pos += static_cast<size_t>(len);
  }
  return absl::OkStatus();
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
