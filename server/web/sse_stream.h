// One Server-Sent-Events stream as an httplib chunked body: the turn every event stream of the
// web API takes (stop when the client has gone, write the stream's events or, idle, a keep-alive
// comment, end the body after the last event), and how events are written.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/web/long_answer_limit.h"

namespace httplib {
class DataSink;
struct Response;
}  // namespace httplib

namespace kiln::web {

// A stream's turn returns at least this often, so it sees a stopping server or limit.
inline constexpr absl::Duration kStreamTurn = absl::Milliseconds(250);

// One event: `event: name` (none when empty: the page's "message") and `data: data`.
std::string SseEvent(const std::string& name, const std::string& data);
// The last event of a stream: why it ended (code "OK" when the job ended or the history was
// all that was asked for).
std::string SseEndEvent(const absl::Status& status);

// A stream says what each turn writes; httplib runs one stream's turns on one thread.
class SseStream {
 public:
  // `slot`: the stream's place among the long answers, given back as soon as its last event is
  // written (a page opens the stream again on reading it), not when httplib destroys the body.
  explicit SseStream(std::unique_ptr<LongAnswerLimit::Slot> slot) : slot_(std::move(slot)) {}
  virtual ~SseStream() = default;

  // Answers `res` (200) with `stream`'s events as its body, for at most `max_duration`: then an
  // "end" event of code DEADLINE_EXCEEDED (the page opens the stream again). An exception from a
  // turn (none is expected) ends the connection rather than kilnd: the handler's own guard has
  // returned by the time the body is written.
  static void Start(httplib::Response& res, std::shared_ptr<SseStream> stream,
                    absl::Duration max_duration);

 protected:
  // This turn's events, whole (empty: none this turn; a turn may wait up to kStreamTurn for
  // one). Sets *last when they end the stream.
  virtual std::string NextEvents(bool* last) = 0;

 private:
  // One turn of httplib's write loop; false ends the connection.
  bool Provide(httplib::DataSink& sink);

  std::unique_ptr<LongAnswerLimit::Slot> slot_;
  bool ended_ = false;
  absl::Time last_write_ = absl::Now();
  absl::Time ends_at_ = absl::InfiniteFuture();
  absl::Duration max_duration_ = absl::InfiniteDuration();
};

}  // namespace kiln::web
