// The turn every event stream of the web API takes (server/web/sse_stream.h), driven through the
// body httplib would write, without a server.
#include "server/web/sse_stream.h"

#include <httplib.h>

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/web/long_answer_limit.h"

namespace kiln::web {
namespace {

using ::testing::HasSubstr;

// One event, then the end.
class TwoEventStream final : public SseStream {
 public:
  explicit TwoEventStream(std::unique_ptr<LongAnswerLimit::Slot> slot)
      : SseStream(std::move(slot)) {}

 private:
  std::string NextEvents(bool* last) override {
    if (sent_++ == 0) return SseEvent("", "{}");
    *last = true;
    return SseEndEvent(absl::OkStatus());
  }
  int sent_ = 0;
};

// A page opens its stream again as soon as it reads the "end" event; the place its old stream
// held must be free by then, not when httplib gets round to destroying the finished body
// (the web API answered such a reopening 503 now and then).
TEST(SseStreamTest, AnEndedStreamGivesItsPlaceBackBeforeItsBodyEnds) {
  LongAnswerLimit limit(1);
  std::unique_ptr<LongAnswerLimit::Slot> slot = limit.Acquire();
  ASSERT_NE(slot, nullptr);
  auto stream = std::make_shared<TwoEventStream>(std::move(slot));
  httplib::Response res;
  SseStream::Start(res, stream, absl::Hours(1));
  ASSERT_TRUE(res.content_provider_);

  std::string body;
  bool done = false;
  int open_when_done = -1;
  httplib::DataSink sink;
  sink.write = [&](const char* data, size_t n) {
    body.append(data, n);
    return true;
  };
  sink.is_writable = [] { return true; };
  sink.done = [&] {
    done = true;
    open_when_done = limit.open_streams();
  };
  for (int turn = 0; turn < 10 && !done; ++turn) ASSERT_TRUE(res.content_provider_(0, 0, sink));
  ASSERT_TRUE(done);
  EXPECT_THAT(body, HasSubstr("event: end"));
  EXPECT_EQ(open_when_done, 0) << "the ended stream still held its place when its body ended";
  EXPECT_NE(limit.Acquire(), nullptr);  // while httplib still holds the stream
}

}  // namespace
}  // namespace kiln::web
