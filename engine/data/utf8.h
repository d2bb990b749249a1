// Strict UTF-8 decoding (RFC 3629): no overlong forms, no surrogates, nothing above U+10FFFF, no
// stray or missing continuation bytes. Text datasets read their corpora through it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kiln {

// Decodes the code point starting at text[pos]: on success sets *code_point and *length (1..4)
// and returns true; on an invalid sequence returns false.
bool DecodeUtf8(std::string_view text, size_t pos, char32_t* code_point, int* length);

// OK when `text` is valid UTF-8; otherwise InvalidArgument naming `what` (a file name) and the
// byte offset of the first invalid sequence.
absl::Status CheckUtf8(std::string_view text, absl::string_view what);

// Appends the UTF-8 form of a valid code point (not a surrogate, at most U+10FFFF).
void AppendUtf8(char32_t code_point, std::string* out);

// "U+00E9" for a code point.
std::string CodePointName(char32_t code_point);

}  // namespace kiln
