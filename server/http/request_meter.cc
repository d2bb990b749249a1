#include "server/http/request_meter.h"

#include <strings.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace kiln::http {
namespace {

// A line longer than this is kept only in part: httplib refuses header lines over 8 KiB anyway.
constexpr size_t kMaxKeptLine = (8 << 10) + 2;

bool SpaceOrTab(char c) { return c == ' ' || c == '\t'; }

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && strncasecmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace

std::string RequestMeter::path() const {
  return target_.substr(0, std::min(target_.find('?'), target_.find('#')));
}

size_t RequestMeter::TakeHead(const char* data, size_t n) {
  size_t taken = 0;
  while (taken < n && state_ == State::kHead) {
    const char* start = data + taken;
    const size_t left = n - taken;
    const char* lf = static_cast<const char*>(std::memchr(start, '\n', left));
    const size_t part = lf == nullptr ? left : static_cast<size_t>(lf - start) + 1;
    if (head_bytes_ + part > limits_.max_head_bytes) {
      state_ = State::kHeadTooLarge;
      return taken;
    }
    head_bytes_ += part;
    taken += part;
    if (line_.size() + part <= kMaxKeptLine) {
      line_.append(start, part);
    } else {
      line_cut_ = true;
    }
    if (lf != nullptr) EndHeadLine();
  }
  return taken;
}

void RequestMeter::EndHeadLine() {
  const bool crlf = !line_cut_ && line_.size() >= 2 && line_[line_.size() - 2] == '\r';
  if (lines_ == 0) {
    // The request line: tokens split on spaces, empty ones skipped (httplib's split).
    std::string_view rest(line_.data(), line_cut_ ? line_.size() : line_.size() - (crlf ? 2 : 1));
    int token = 0;
    while (!rest.empty() && token < 2) {
      const size_t space = rest.find(' ');
      const std::string_view word = rest.substr(0, space);
      if (!word.empty()) (token++ == 0 ? method_ : target_) = std::string(word);
      rest = space == std::string_view::npos ? std::string_view() : rest.substr(space + 1);
    }
    ++lines_;
  } else if (line_ == "\r\n") {
    EndHead();
  } else if (++lines_ - 1 > limits_.max_headers) {
    state_ = State::kTooManyHeaders;
  } else if (crlf) {
    // A header line as httplib parses it: the name up to ':', the value without the spaces and
    // tabs around it; a line without CRLF is skipped, as is a header with an empty value.
    std::string_view text(line_.data(), line_.size() - 2);
    while (!text.empty() && SpaceOrTab(text.back())) text.remove_suffix(1);
    const size_t colon = text.find(':');
    if (colon != std::string_view::npos) {
      const std::string_view name = text.substr(0, colon);
      std::string_view value = text.substr(colon + 1);
      while (!value.empty() && SpaceOrTab(value.front())) value.remove_prefix(1);
      if (!value.empty()) {
        if (EqualsIgnoreCase(name, "Content-Length")) {
          if (content_lengths_++ == 0) {
            content_length_text_ = std::string(value);
          } else if (value != content_length_text_) {
            content_lengths_differ_ = true;
          }
        } else if (EqualsIgnoreCase(name, "Transfer-Encoding")) {
          if (transfer_encodings_++ == 0) transfer_encoding_ = std::string(value);
        }
      }
    }
  }
  line_.clear();
  line_cut_ = false;
}

void RequestMeter::EndHead() {
  state_ = State::kBody;
  if (transfer_encodings_ > 0) {
    // httplib would percent-decode the value, and take a Content-Length beside it: both are ways
    // to read a body other than the one a proxy in front reads, so neither is taken.
    if (content_lengths_ > 0 || transfer_encodings_ > 1 ||
        !EqualsIgnoreCase(transfer_encoding_, "chunked")) {
      state_ = State::kBadFraming;
      return;
    }
    framing_ = Framing::kChunked;
    return;
  }
  if (content_lengths_ > 0) {
    const std::string& text = content_length_text_;
    if (content_lengths_differ_ || text.empty() || text.size() > 19 ||
        !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      state_ = State::kBadFraming;
      return;
    }
    framing_ = Framing::kLength;
    content_length_ = std::strtoull(text.c_str(), nullptr, 10);
    body_left_ = content_length_;
    if (content_length_ > limits_.max_body_bytes) {
      state_ = State::kBodyTooLarge;
    } else if (content_length_ == 0) {
      state_ = State::kDone;
    }
    return;
  }
  state_ = State::kDone;  // no body (RFC 9112 6.3: a request without either has none)
}

ptrdiff_t RequestMeter::TakeBody(const char* data, size_t n) {
  if (state_ == State::kDone) return 0;
  if (state_ != State::kBody) return -1;
  if (framing_ == Framing::kLength) {
    const size_t taken = static_cast<size_t>(std::min<uint64_t>(n, body_left_));
    body_left_ -= taken;
    if (body_left_ == 0) state_ = State::kDone;
    return static_cast<ptrdiff_t>(taken);
  }
  size_t taken = 0;
  while (taken < n && state_ == State::kBody) {
    if (chunk_part_ == ChunkPart::kData) {
      const size_t part = static_cast<size_t>(std::min<uint64_t>(n - taken, body_left_));
      taken += part;
      body_left_ -= part;
      if (body_left_ == 0) chunk_part_ = ChunkPart::kDataEnd;
      continue;
    }
    const char c = data[taken++];
    if (chunk_line_.size() >= kMaxChunkLineBytes) {
      state_ = State::kBadChunk;
      break;
    }
    chunk_line_.push_back(c);
    if (c == '\n' && !EndChunkLine()) break;
  }
  return failed() ? -1 : static_cast<ptrdiff_t>(taken);
}

bool RequestMeter::EndChunkLine() {
  bool ok = false;
  switch (chunk_part_) {
    case ChunkPart::kSizeLine: {
      // The size as httplib reads it (strtoul, base 16), extensions after it ignored.
      char* end = nullptr;
      errno = 0;
      const unsigned long long size = std::strtoull(chunk_line_.c_str(), &end, 16);
      if (end == chunk_line_.c_str() || errno == ERANGE) break;
      if (size > limits_.max_body_bytes - chunk_data_) {
        state_ = State::kBodyTooLarge;
        chunk_line_.clear();
        return false;
      }
      if (size == 0) {
        chunk_part_ = ChunkPart::kTrailer;
      } else {
        chunk_data_ += size;
        body_left_ = size;
        chunk_part_ = ChunkPart::kData;
      }
      ok = true;
      break;
    }
    case ChunkPart::kDataEnd:
      ok = chunk_line_ == "\r\n";
      chunk_part_ = ChunkPart::kSizeLine;
      break;
    case ChunkPart::kTrailer:
      // httplib takes no trailer fields: the last chunk is followed by CRLF alone.
      ok = chunk_line_ == "\r\n";
      if (ok) state_ = State::kDone;
      break;
    case ChunkPart::kData:
      break;
  }
  chunk_line_.clear();
  if (!ok) state_ = State::kBadChunk;
  return ok;
}

}  // namespace kiln::http
