// The web API's live event streams: one job's events (/api/jobs/{id}/events) and which jobs
// changed (/api/events), as Server-Sent Events, at most WebApiOptions::max_long_answers open.
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/web/api_replies.h"
#include "server/web/sse_stream.h"
#include "server/web/web_api.h"

namespace kiln::web {
namespace {

using nlohmann::json;

// The jobs feed sends at most one batch of changed jobs per this, so a job's steps (thousands a
// second on a small model) cost a page one fetch a second.
constexpr absl::Duration kFeedInterval = absl::Seconds(1);
// History events written per turn, to bound what one write buffers.
constexpr int kHistoryEventsPerTurn = 256;

// A query parameter that must be 0 or 1 (absent: `absent`).
absl::StatusOr<bool> FlagParam(const httplib::Request& req, const char* name, bool absent) {
  if (!req.has_param(name)) return absent;
  const std::string value = req.get_param_value(name);
  if (value == "1" || value == "true") return true;
  if (value == "0" || value == "false") return false;
  return absl::InvalidArgumentError(absl::StrCat(name, ": must be 0 or 1, got \"", value, "\""));
}

// One job's events as a stream: its recorded history, a "history_end" event, then (with
// follow) its live events until the job ends, kilnd stops or the client goes.
class JobEventStream final : public SseStream {
 public:
  JobEventStream(server::JobWatch watch, server::MetricBroadcaster* broadcaster,
                 std::unique_ptr<LongAnswerLimit::Slot> slot, const LongAnswerLimit* limit,
                 bool follow)
      : SseStream(std::move(slot)),
        watch_(std::move(watch)),
        broadcaster_(broadcaster),
        limit_(limit),
        follow_(follow) {}
  ~JobEventStream() override {
    if (watch_.live) broadcaster_->Unsubscribe(watch_.live);
  }

 private:
  std::string NextEvents(bool* last) override {
    std::string out;
    v1::JobEvent event;
    if (limit_->stopping()) {
      out = SseEndEvent(absl::UnavailableError("kilnd is stopping"));
      *last = true;
    } else if (watch_.current_state) {
      out = SseEvent("", ProtoJson(*watch_.current_state));
      watch_.current_state.reset();
    } else if (watch_.history) {
      for (int i = 0; i < kHistoryEventsPerTurn; ++i) {
        absl::StatusOr<bool> next = watch_.history->Next(&event);
        if (!next.ok()) {
          out += SseEndEvent(next.status());
          *last = true;
          break;
        }
        if (!*next) {
          watch_.history.reset();
          out += SseEvent("history_end", "{}");
          break;
        }
        out += SseEvent("", ProtoJson(event));
      }
    } else if (!follow_ || !watch_.live) {
      out = SseEndEvent(absl::OkStatus());
      *last = true;
    } else if (watch_.live->WaitPop(&event, kStreamTurn)) {
      out = SseEvent("", ProtoJson(event));
      for (int i = 1; i < kHistoryEventsPerTurn && watch_.live->Pop(&event); ++i) {
        out += SseEvent("", ProtoJson(event));
      }
    } else if (absl::Status closed; watch_.live->Finished(&closed)) {
      out = SseEndEvent(closed);
      *last = true;
    }
    return out;
  }

  server::JobWatch watch_;
  server::MetricBroadcaster* broadcaster_;
  const LongAnswerLimit* limit_;
  const bool follow_;
};

// Which jobs changed: an "open" event at once (the page then reads the table, missing nothing),
// then "jobs" events {"job_ids": [...]} at most once per kFeedInterval, until kilnd stops or the
// client goes. Only jobs the caller sees are named (`sees`): another team's are not there.
class JobsFeedStream final : public SseStream {
 public:
  JobsFeedStream(JobsFeed* feed, std::function<bool(const std::string& job_id)> sees,
                 std::unique_ptr<LongAnswerLimit::Slot> slot, const LongAnswerLimit* limit)
      : SseStream(std::move(slot)),
        feed_(feed),
        sees_(std::move(sees)),
        listener_(feed->Listen()),
        limit_(limit) {}
  ~JobsFeedStream() override { feed_->Forget(listener_); }

 private:
  std::string NextEvents(bool* last) override {
    const absl::Time now = absl::Now();
    std::set<std::string> changed;
    if (!opened_) {
      opened_ = true;
      return SseEvent("open", "{}");
    }
    if (limit_->stopping()) {
      *last = true;
      return SseEndEvent(absl::UnavailableError("kilnd is stopping"));
    }
    if (now < next_send_) {
      std::this_thread::sleep_for(
          absl::ToChronoNanoseconds(std::min(next_send_ - now, kStreamTurn)));
      return "";
    }
    if (!listener_->WaitTake(&changed, kStreamTurn)) return "";
    for (auto it = changed.begin(); it != changed.end();) {
      it = sees_(*it) ? std::next(it) : changed.erase(it);
    }
    if (changed.empty()) return "";
    next_send_ = now + kFeedInterval;
    return SseEvent("jobs", json{{"job_ids", changed}}.dump());
  }

  JobsFeed* feed_;
  const std::function<bool(const std::string&)> sees_;
  std::shared_ptr<JobsFeed::Listener> listener_;
  const LongAnswerLimit* limit_;
  bool opened_ = false;
  absl::Time next_send_ = absl::InfinitePast();
};

}  // namespace

void WebApi::AddEventRoutes(http::HttpServer* server) {
  Get(server, "/api/jobs/([^/]+)/events",
      [this](const httplib::Request& req, httplib::Response& res, const server::Caller& caller) {
        absl::StatusOr<bool> steps = FlagParam(req, "steps", true);
        absl::StatusOr<bool> follow = FlagParam(req, "follow", true);
        for (const absl::Status& s : {steps.status(), follow.status()}) {
          if (!s.ok()) {
            ReplyStatus(res, s);
            return;
          }
        }
        std::unique_ptr<LongAnswerLimit::Slot> slot = AcquireLongAnswer(res);
        if (slot == nullptr) return;
        absl::StatusOr<server::JobWatch> watch =
            jobs_->Watch(caller, req.matches[1], *steps, /*live_only=*/false);
        if (!watch.ok()) {
          ReplyStatus(res, watch.status());
          return;
        }
        SseStream::Start(res,
                         std::make_shared<JobEventStream>(*std::move(watch), broadcaster_,
                                                          std::move(slot), &long_answers_, *follow),
                         options_.max_stream_duration);
      });

  Get(server, "/api/events",
      [this](const httplib::Request&, httplib::Response& res, const server::Caller& caller) {
        std::unique_ptr<LongAnswerLimit::Slot> slot = AcquireLongAnswer(res);
        if (slot == nullptr) return;
        auto sees = [jobs = jobs_, caller](const std::string& job_id) {
          return jobs->SeesJob(caller, job_id);
        };
        SseStream::Start(res,
                         std::make_shared<JobsFeedStream>(feed_, std::move(sees), std::move(slot),
                                                          &long_answers_),
                         options_.max_stream_duration);
      });
}

}  // namespace kiln::web
