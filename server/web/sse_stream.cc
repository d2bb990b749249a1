#include "server/web/sse_stream.h"

#include <httplib.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/client_message.h"
#include "nlohmann/json.hpp"

namespace kiln::web {
namespace {

// An idle stream writes a comment this often: a write is how a closed client is surely noticed
// (a page that moves on closes its stream), and its slot freed for the next one.
constexpr absl::Duration kKeepAlive = absl::Seconds(2);

}  // namespace

std::string SseEvent(const std::string& name, const std::string& data) {
  std::string out = name.empty() ? "" : absl::StrCat("event: ", name, "\n");
  absl::StrAppend(&out, "data: ", data, "\n\n");
  return out;
}

std::string SseEndEvent(const absl::Status& status) {
  using nlohmann::json;
  return SseEvent("end", json{{"code", absl::StatusCodeToString(status.code())},
                              {"message", status.ok() ? "" : ClientMessage(status)}}
                             .dump(-1, ' ', false, json::error_handler_t::replace));
}

void SseStream::Start(httplib::Response& res, std::shared_ptr<SseStream> stream,
                      absl::Duration max_duration) {
  stream->max_duration_ = max_duration;
  stream->ends_at_ = absl::Now() + max_duration;
  res.status = 200;
  // Proxies (nginx) would otherwise buffer the stream.
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider("text/event-stream",
                                   [stream = std::move(stream)](size_t, httplib::DataSink& sink) {
                                     try {
                                       return stream->Provide(sink);
                                     } catch (...) {
                                       return false;
                                     }
                                   });
}

bool SseStream::Provide(httplib::DataSink& sink) {
  if (!sink.is_writable()) return false;  // the client has gone
  if (ended_) {
    sink.done();
    return true;
  }
  std::string out;
  if (absl::Now() >= ends_at_) {
    // A client that never reads would otherwise keep its place for as long as kilnd runs.
    out = SseEndEvent(absl::DeadlineExceededError(
        absl::StrCat("the stream was open for ", absl::FormatDuration(max_duration_),
                     ", the longest one stays; open it again to go on")));
    ended_ = true;
  } else {
    out = NextEvents(&ended_);
  }
  if (out.empty() && !ended_ && absl::Now() - last_write_ > kKeepAlive) out = ": keep-alive\n\n";
  // httplib takes an empty write for the end of the body: write only bytes.
  if (!out.empty()) {
    if (!sink.write(out.data(), out.size())) return false;
    last_write_ = absl::Now();
  }
  if (ended_) {
    slot_.reset();
    sink.done();
  }
  return true;
}

}  // namespace kiln::web
