// Strict UTF-8 decoding (RFC 3629): no overlong forms, no surrogates, nothing above U+10FFFF, no
// stray or missing continuation bytes. Text datasets read their corpora through it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kiln {

// Decodes the code point starting at text[pos]: on success sets *code_point and *length (1..4)
// and returns true; on an invalid sequence returns false.
bool DecodeUtf8(std::string_view text, size_t pos, char32_t* code_point, int* length);

// The byte offset of the first invalid sequence in `text`, or npos when it is all valid.
size_t FindInvalidUtf8(std::string_view text);

// OK when `text` is valid UTF-8; otherwise InvalidArgument naming `what` (a file name) and the
// byte offset of the first invalid sequence.
absl::Status CheckUtf8(std::string_view text, absl::string_view what);

// Checks UTF-8 as it streams past in pieces that may cut a character (an upload's chunks), so
// bad text is refused at its first bad byte. Errors are CheckUtf8's, offsets from the stream's
// start. Not thread-safe.
class Utf8StreamCheck {
 public:
  explicit Utf8StreamCheck(std::string name) : name_(std::move(name)) {}
  absl::Status Consume(std::string_view bytes);
  // InvalidArgument when the stream ended inside a character.
  absl::Status Finish() const;

 private:
  std::string name_;
  std::string pending_;  // the start of a character the last piece cut (at most 3 bytes)
  int64_t offset_ = 0;   // stream offset of pending_ (or of the next piece when it is empty)
};

// Appends the UTF-8 form of a valid code point (not a surrogate, at most U+10FFFF).
void AppendUtf8(char32_t code_point, std::string* out);

// "U+00E9" for a code point.
std::string CodePointName(char32_t code_point);

}  // namespace kiln
