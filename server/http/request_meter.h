// Counts one HTTP/1.1 request's bytes as they arrive, so that nothing of it is read past a limit:
// the head (request line and header lines, up to the blank line) within max_head_bytes and
// max_headers lines, then the body as the head frames it: Content-Length bytes, or a chunked body
// of at most max_body_bytes of data with framing lines of at most kMaxChunkLineBytes. It also
// keeps what the listener needs from the head before httplib parses it (method, target,
// framing), and says whether the request was read exactly whole, so that the connection's next
// bytes are the next request.
//
// It reads lines as httplib 0.11 does (a line ends at LF; the head ends at the first line after
// the request line that is exactly CRLF), so that both agree on where the head ends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln::http {

class RequestMeter {
 public:
  struct Limits {
    size_t max_head_bytes = 64 << 10;
    int max_headers = 100;
    size_t max_body_bytes = 16 << 20;
  };
  enum class State {
    kHead,            // the head is still arriving
    kBody,            // the head is whole; the body is being read
    kDone,            // the request is read whole
    kHeadTooLarge,    // over max_head_bytes
    kTooManyHeaders,  // over max_headers
    kBadFraming,      // Content-Length and Transfer-Encoding together, a coding other than
                      // chunked, or a Content-Length that is not one decimal number
    kBodyTooLarge,    // a Content-Length or chunk sizes over max_body_bytes
    kBadChunk,        // chunked framing that is not HTTP's (or a line over its limit)
  };
  enum class Framing { kNone, kLength, kChunked };

  static constexpr size_t kMaxChunkLineBytes = 1024;

  explicit RequestMeter(Limits limits) : limits_(limits) {}

  // The next `n` bytes of the connection while the head arrives: returns how many belong to the
  // head (all of them until it ends, then those up to its end). Stops at a limit: see state().
  size_t TakeHead(const char* data, size_t n);
  // The next `n` bytes of the body: how many of them may be passed on (0 once the body is
  // whole), or -1 when they cross a limit or break the framing (see state()).
  ptrdiff_t TakeBody(const char* data, size_t n);

  State state() const { return state_; }
  bool failed() const { return state_ > State::kDone; }
  size_t head_bytes() const { return head_bytes_; }
  Framing framing() const { return framing_; }
  uint64_t content_length() const { return content_length_; }  // with Framing::kLength
  // From the request line (empty until it has arrived; cut at 8 KiB).
  const std::string& method() const { return method_; }
  const std::string& target() const { return target_; }
  // The target's path: up to '?' or '#'.
  std::string path() const;

 private:
  enum class ChunkPart { kSizeLine, kData, kDataEnd, kTrailer };

  void EndHeadLine();
  void EndHead();
  // One line of chunked framing: false when it breaks the framing or a limit.
  bool EndChunkLine();

  const Limits limits_;
  State state_ = State::kHead;
  size_t head_bytes_ = 0;
  int lines_ = 0;     // lines of the head so far, the request line included
  std::string line_;  // the head line arriving (cut at kMaxKeptLine)
  bool line_cut_ = false;
  std::string method_, target_;
  int content_lengths_ = 0, transfer_encodings_ = 0;
  std::string content_length_text_, transfer_encoding_;
  bool content_lengths_differ_ = false;

  Framing framing_ = Framing::kNone;
  uint64_t content_length_ = 0;
  uint64_t body_left_ = 0;   // kLength: bytes still to come; kChunked: of the chunk being read
  uint64_t chunk_data_ = 0;  // kChunked: data bytes announced so far
  ChunkPart chunk_part_ = ChunkPart::kSizeLine;
  std::string chunk_line_;
};

}  // namespace kiln::http
