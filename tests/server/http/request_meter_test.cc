// The HTTP listener's RequestMeter: where a head ends (as httplib reads lines), its byte and line
// limits, the body's framing, and a chunked body metered on the wire, byte by byte or at once.
#include "server/http/request_meter.h"

#include <string>

#include "gtest/gtest.h"

namespace kiln::http {
namespace {

using State = RequestMeter::State;

RequestMeter::Limits Small() {
  RequestMeter::Limits limits;
  limits.max_head_bytes = 1024;
  limits.max_headers = 4;
  limits.max_body_bytes = 100;
  return limits;
}

// Feeds `text` one byte at a time (as a trickle arrives) or at once; returns the bytes taken.
size_t FeedHead(RequestMeter& m, const std::string& text, bool bytewise) {
  if (!bytewise) return m.TakeHead(text.data(), text.size());
  size_t taken = 0;
  for (char c : text) taken += m.TakeHead(&c, 1);
  return taken;
}

ptrdiff_t FeedBody(RequestMeter& m, const std::string& text, bool bytewise) {
  if (!bytewise) return m.TakeBody(text.data(), text.size());
  ptrdiff_t taken = 0;
  for (char c : text) {
    const ptrdiff_t n = m.TakeBody(&c, 1);
    if (n < 0) return n;
    taken += n;
  }
  return taken;
}

TEST(RequestMeterTest, AHeadEndsAtItsBlankLineAndNamesItsRequest) {
  for (bool bytewise : {false, true}) {
    RequestMeter m(Small());
    const std::string head = "GET /metrics?x=1 HTTP/1.1\r\nHost: kiln\r\n\r\n";
    EXPECT_EQ(FeedHead(m, head + "GET /next", bytewise), head.size());
    EXPECT_EQ(m.state(), State::kDone);  // no body
    EXPECT_EQ(m.head_bytes(), head.size());
    EXPECT_EQ(m.method(), "GET");
    EXPECT_EQ(m.target(), "/metrics?x=1");
    EXPECT_EQ(m.path(), "/metrics");
  }
}

TEST(RequestMeterTest, LinesWithoutCrlfDoNotEndTheHeadAsHttplibSkipsThem) {
  RequestMeter m(Small());
  const std::string head = "GET / HTTP/1.1\r\nX: y\n\n\r\n";
  EXPECT_EQ(m.TakeHead(head.data(), head.size()), head.size());
  EXPECT_EQ(m.state(), State::kDone);
}

TEST(RequestMeterTest, AHeadPastItsBytesOrLinesStops) {
  RequestMeter bytes(Small());
  const std::string big = "GET / HTTP/1.1\r\nX: " + std::string(2000, 'p');
  EXPECT_LT(bytes.TakeHead(big.data(), big.size()), 1024u + 1);
  EXPECT_EQ(bytes.state(), State::kHeadTooLarge);

  RequestMeter lines(Small());
  std::string head = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 5; ++i) head += "X: y\r\n";
  lines.TakeHead(head.data(), head.size());
  EXPECT_EQ(lines.state(), State::kTooManyHeaders);

  RequestMeter four(Small());
  head = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 4; ++i) head += "X: y\r\n";
  head += "\r\n";
  four.TakeHead(head.data(), head.size());
  EXPECT_EQ(four.state(), State::kDone);
}

TEST(RequestMeterTest, AContentLengthBodyIsTakenToItsLength) {
  RequestMeter m(Small());
  const std::string head = "POST /x HTTP/1.1\r\ncontent-length:  10 \r\n\r\n";
  m.TakeHead(head.data(), head.size());
  ASSERT_EQ(m.state(), State::kBody);
  EXPECT_EQ(m.framing(), RequestMeter::Framing::kLength);
  EXPECT_EQ(m.content_length(), 10u);
  const std::string body = "0123456789GET / HTTP/1.1";
  EXPECT_EQ(m.TakeBody(body.data(), 4), 4);
  EXPECT_EQ(m.TakeBody(body.data() + 4, body.size() - 4), 6);
  EXPECT_EQ(m.state(), State::kDone);
  EXPECT_EQ(m.TakeBody(body.data() + 10, 5), 0);
}

TEST(RequestMeterTest, FramingThatIsNotClearOrOverTheLimitIsRefused) {
  for (const std::string& headers :
       {std::string("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n"),
        std::string("Transfer-Encoding: gzip, chunked\r\n"),
        std::string("Transfer-Encoding: %63hunked\r\n"), std::string("Content-Length: 5x\r\n"),
        std::string("Content-Length: 5\r\nContent-Length: 6\r\n"),
        std::string("Content-Length: -1\r\n")}) {
    RequestMeter m(Small());
    const std::string head = "POST /x HTTP/1.1\r\n" + headers + "\r\n";
    m.TakeHead(head.data(), head.size());
    EXPECT_EQ(m.state(), State::kBadFraming) << headers;
  }
  RequestMeter same(Small());
  std::string head = "POST /x HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n";
  same.TakeHead(head.data(), head.size());
  EXPECT_EQ(same.state(), State::kBody);

  RequestMeter large(Small());
  head = "POST /x HTTP/1.1\r\nContent-Length: 101\r\n\r\n";
  large.TakeHead(head.data(), head.size());
  EXPECT_EQ(large.state(), State::kBodyTooLarge);
  EXPECT_EQ(large.TakeBody("x", 1), -1);
}

TEST(RequestMeterTest, AChunkedBodyIsMeteredToItsEndAndNoFurther) {
  for (bool bytewise : {false, true}) {
    RequestMeter m(Small());
    const std::string head = "POST /x HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n";
    m.TakeHead(head.data(), head.size());
    ASSERT_EQ(m.framing(), RequestMeter::Framing::kChunked);
    const std::string body = "5;ext=1\r\nhello\r\n1E\r\n" + std::string(30, 'w') + "\r\n0\r\n\r\n";
    EXPECT_EQ(FeedBody(m, body + "GET / HTTP/1.1", bytewise), static_cast<ptrdiff_t>(body.size()));
    EXPECT_EQ(m.state(), State::kDone) << bytewise;
  }
}

TEST(RequestMeterTest, AChunkedBodyOverTheLimitOrBrokenStops) {
  struct Case {
    std::string body;
    State state;
  };
  for (const Case& c :
       {Case{"40\r\n" + std::string(64, 'a') + "\r\n40\r\n", State::kBodyTooLarge},
        Case{"ffffffffffffffff\r\n", State::kBodyTooLarge}, Case{"-1\r\n", State::kBodyTooLarge},
        Case{"zz\r\n", State::kBadChunk}, Case{"1\r\nab\r\n", State::kBadChunk},
        Case{"0\r\nTrailer: x\r\n\r\n", State::kBadChunk},
        Case{std::string(2000, '0'), State::kBadChunk}}) {
    for (bool bytewise : {false, true}) {
      RequestMeter m(Small());
      const std::string head = "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
      m.TakeHead(head.data(), head.size());
      EXPECT_EQ(FeedBody(m, c.body, bytewise), -1) << c.body.substr(0, 20);
      EXPECT_EQ(m.state(), c.state) << c.body.substr(0, 20);
    }
  }
}

}  // namespace
}  // namespace kiln::http
