#include "server/web/web_api.h"

#include <google/protobuf/util/json_util.h>
#include <httplib.h>

#include <algorithm>
#include <cstdint>
#include <future>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/grpc/status_mapping.h"
#include "server/http/rest_inference.h"
#include "server/web/sse_stream.h"

namespace kiln::web {
namespace {

using http::Access;
using nlohmann::json;

constexpr char kJson[] = "application/json";
constexpr int kDefaultPageSize = 100;
constexpr int kMaxPageSize = 1000;
constexpr int kExportChunkBytes = 1 << 20;
// The jobs feed sends at most one batch of changed jobs per this, so a job's steps (thousands a
// second on a small model) cost a page one fetch a second.
constexpr absl::Duration kFeedInterval = absl::Seconds(1);
// History events written per turn, to bound what one write buffers.
constexpr int kHistoryEventsPerTurn = 256;

const std::vector<WebApiRoute>& Routes() {
  static const auto* routes = new std::vector<WebApiRoute>{
      {"GET", "/api/jobs", "/api/jobs"},
      {"GET", "/api/jobs/([^/]+)", "/api/jobs/job-0"},
      {"GET", "/api/jobs/([^/]+)/checkpoints", "/api/jobs/job-0/checkpoints"},
      {"GET", R"(/api/jobs/([^/]+)/checkpoints/(\d+)/file)", "/api/jobs/job-0/checkpoints/1/file"},
      {"GET", "/api/jobs/([^/]+)/events", "/api/jobs/job-0/events"},
      {"POST", "/api/jobs/([^/]+)/cancel", "/api/jobs/job-0/cancel"},
      {"POST", "/api/jobs/([^/]+)/resume", "/api/jobs/job-0/resume"},
      {"POST", "/api/jobs/([^/]+)/checkpoint", "/api/jobs/job-0/checkpoint"},
      {"GET", "/api/events", "/api/events"},
      {"GET", "/api/models", "/api/models"},
  };
  return *routes;
}

std::string ProtoJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string out;
  // Our own messages always convert; an error would leave "{}" rather than a broken body.
  if (!google::protobuf::util::MessageToJsonString(message, &out, options).ok()) return "{}";
  return out;
}

// The error as the gRPC path words it (server paths shown by their folder names).
void ReplyStatus(httplib::Response& res, const absl::Status& status) {
  http::ReplyError(res, http::HttpStatusOf(status.code()),
                   server::ToGrpcStatus(status).error_message());
}

void ReplyJson(httplib::Response& res, const std::string& body) {
  res.status = 200;
  res.set_content(body, kJson);
}

// A query parameter that must be 0 or 1 (absent: `absent`).
absl::StatusOr<bool> FlagParam(const httplib::Request& req, const char* name, bool absent) {
  if (!req.has_param(name)) return absent;
  const std::string value = req.get_param_value(name);
  if (value == "1" || value == "true") return true;
  if (value == "0" || value == "false") return false;
  return absl::InvalidArgumentError(absl::StrCat(name, ": must be 0 or 1, got \"", value, "\""));
}

// A place for one more event stream, or null with `res` answered 503.
std::unique_ptr<SseStreamLimit::Slot> AcquireStreamSlot(SseStreamLimit& streams,
                                                        httplib::Response& res) {
  std::unique_ptr<SseStreamLimit::Slot> slot = streams.Acquire();
  if (slot == nullptr) {
    http::ReplyError(
        res, 503,
        absl::StrCat("too many event streams open (", streams.max_streams(), "); try again later"));
  }
  return slot;
}

// One job's events as a stream: its recorded history, a "history_end" event, then (with
// follow) its live events until the job ends, kilnd stops or the client goes.
class JobEventStream final : public SseStream {
 public:
  JobEventStream(server::JobWatch watch, server::MetricBroadcaster* broadcaster,
                 std::unique_ptr<SseStreamLimit::Slot> slot, const SseStreamLimit* limit,
                 bool follow)
      : watch_(std::move(watch)),
        broadcaster_(broadcaster),
        slot_(std::move(slot)),
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
  std::unique_ptr<SseStreamLimit::Slot> slot_;
  const SseStreamLimit* limit_;
  const bool follow_;
};

// Which jobs changed: an "open" event at once (the page then reads the table, missing nothing),
// then "jobs" events {"job_ids": [...]} at most once per kFeedInterval, until kilnd stops or the
// client goes.
class JobsFeedStream final : public SseStream {
 public:
  JobsFeedStream(JobsFeed* feed, std::unique_ptr<SseStreamLimit::Slot> slot,
                 const SseStreamLimit* limit)
      : feed_(feed), listener_(feed->Listen()), slot_(std::move(slot)), limit_(limit) {}
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
    next_send_ = now + kFeedInterval;
    return SseEvent("jobs", json{{"job_ids", changed}}.dump());
  }

  JobsFeed* feed_;
  std::shared_ptr<JobsFeed::Listener> listener_;
  std::unique_ptr<SseStreamLimit::Slot> slot_;
  const SseStreamLimit* limit_;
  bool opened_ = false;
  absl::Time next_send_ = absl::InfinitePast();
};

// The resume request's body: empty, or {"epochs": N, "checkpoint_id": M}, both optional.
absl::Status ParseResume(const std::string& body, int* epochs, int64_t* checkpoint_id) {
  if (body.empty()) return absl::OkStatus();
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("the request body: not a JSON object");
  }
  for (const auto& [key, value] : j.items()) {
    if (key != "epochs" && key != "checkpoint_id") {
      return absl::InvalidArgumentError(
          absl::StrCat(key, ": not a field of a resume (epochs, checkpoint_id)"));
    }
    if (!value.is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(key, ": must be an integer"));
    }
  }
  if (j.contains("epochs")) {
    const int64_t e = j["epochs"].get<int64_t>();
    if (e < 0 || e > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("epochs: must be 0 or more, got ", e));
    }
    *epochs = static_cast<int>(e);
  }
  if (j.contains("checkpoint_id")) {
    *checkpoint_id = j["checkpoint_id"].get<int64_t>();
    if (*checkpoint_id < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint_id: must be 0 (the newest) or a checkpoint's id, got ", *checkpoint_id));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<WebApiRoute>& WebApiRoutes() { return Routes(); }

WebApi::WebApi(server::JobManager* jobs, server::MetricBroadcaster* broadcaster,
               serving::ModelRepository* models, server::Metrics* metrics, JobsFeed* feed,
               WebApiOptions options)
    : jobs_(jobs),
      broadcaster_(broadcaster),
      models_(models),
      metrics_(metrics),
      feed_(feed),
      options_(options),
      streams_(options.max_event_streams) {}

void WebApi::AddRoutes(http::HttpServer* server) {
  // Every /api route needs a token (when tokens are on), and is recorded for registered_routes.
  auto get = [this, server](const std::string& pattern, http::HttpServer::Handler handler) {
    registered_.push_back({"GET", pattern});
    server->Get(pattern, Access::kToken, std::move(handler));
  };
  auto post = [this, server](const std::string& pattern, http::HttpServer::Handler handler) {
    registered_.push_back({"POST", pattern});
    server->Post(pattern, Access::kToken, std::move(handler));
  };
  get("/api/jobs", [this](const httplib::Request& req, httplib::Response& res) {
    int page_size = kDefaultPageSize;
    if (req.has_param("page_size") &&
        (!absl::SimpleAtoi(req.get_param_value("page_size"), &page_size) || page_size < 1 ||
         page_size > kMaxPageSize)) {
      http::ReplyError(res, 400,
                       absl::StrCat("page_size: must be an integer in [1, ", kMaxPageSize,
                                    "], got \"", req.get_param_value("page_size"), "\""));
      return;
    }
    absl::StatusOr<server::JobPage> page =
        jobs_->List({}, page_size, req.get_param_value("page_token"));
    if (!page.ok()) {
      ReplyStatus(res, page.status());
      return;
    }
    // Newest first, as ListJobs and `kiln jobs` order them.
    std::string body = "{\"jobs\":[";
    for (size_t i = 0; i < page->jobs.size(); ++i) {
      absl::StrAppend(&body, i == 0 ? "" : ",", ProtoJson(page->jobs[i]));
    }
    absl::StrAppend(&body, "],\"next_page_token\":", json(page->next_page_token).dump(), "}");
    ReplyJson(res, body);
  });

  get("/api/jobs/([^/]+)", [this](const httplib::Request& req, httplib::Response& res) {
    absl::StatusOr<v1::Job> job = jobs_->Get(req.matches[1]);
    if (!job.ok()) {
      ReplyStatus(res, job.status());
      return;
    }
    ReplyJson(res, ProtoJson(*job));
  });

  get("/api/jobs/([^/]+)/checkpoints", [this](const httplib::Request& req, httplib::Response& res) {
    absl::StatusOr<std::vector<v1::Checkpoint>> list = jobs_->ListCheckpoints(req.matches[1]);
    if (!list.ok()) {
      ReplyStatus(res, list.status());
      return;
    }
    std::string body = "{\"checkpoints\":[";
    for (size_t i = 0; i < list->size(); ++i) {
      absl::StrAppend(&body, i == 0 ? "" : ",", ProtoJson((*list)[i]));
    }
    ReplyJson(res, body + "]}");
  });

  // The checkpoint's file, streamed from the same export the gRPC ExportCheckpoint streams.
  get(R"(/api/jobs/([^/]+)/checkpoints/(\d+)/file)",
      [this](const httplib::Request& req, httplib::Response& res) {
        int64_t checkpoint_id = 0;
        if (!absl::SimpleAtoi(req.matches[2].str(), &checkpoint_id)) {
          http::ReplyError(res, 400, "checkpoint id: not a number");
          return;
        }
        const std::string job_id = req.matches[1];
        absl::StatusOr<std::unique_ptr<server::CheckpointExport>> source =
            jobs_->ExportCheckpoint(job_id, checkpoint_id, kExportChunkBytes);
        if (!source.ok()) {
          ReplyStatus(res, source.status());
          return;
        }
        std::shared_ptr<server::CheckpointExport> file = *std::move(source);
        res.status = 200;
        res.set_header("Content-Disposition",
                       absl::StrCat("attachment; filename=\"", job_id, "-checkpoint-",
                                    checkpoint_id, ".safetensors\""));
        res.set_chunked_content_provider(
            "application/octet-stream", [file](size_t, httplib::DataSink& sink) {
              try {
                while (!file->done()) {
                  v1::CheckpointChunk chunk;
                  if (!file->Next(&chunk).ok()) return false;  // the client sees a cut body
                  if (chunk.data().empty()) continue;
                  return sink.write(chunk.data().data(), chunk.data().size());
                }
                sink.done();
                return true;
              } catch (...) {
                return false;
              }
            });
      });

  get("/api/jobs/([^/]+)/events", [this](const httplib::Request& req, httplib::Response& res) {
    absl::StatusOr<bool> steps = FlagParam(req, "steps", true);
    absl::StatusOr<bool> follow = FlagParam(req, "follow", true);
    for (const absl::Status& s : {steps.status(), follow.status()}) {
      if (!s.ok()) {
        ReplyStatus(res, s);
        return;
      }
    }
    std::unique_ptr<SseStreamLimit::Slot> slot = AcquireStreamSlot(streams_, res);
    if (slot == nullptr) return;
    absl::StatusOr<server::JobWatch> watch =
        jobs_->Watch(req.matches[1], *steps, /*live_only=*/false);
    if (!watch.ok()) {
      ReplyStatus(res, watch.status());
      return;
    }
    SseStream::Start(res, std::make_shared<JobEventStream>(*std::move(watch), broadcaster_,
                                                           std::move(slot), &streams_, *follow));
  });

  post("/api/jobs/([^/]+)/cancel", [this](const httplib::Request& req, httplib::Response& res) {
    absl::StatusOr<v1::Job> job = jobs_->Cancel(req.matches[1]);
    if (!job.ok()) {
      ReplyStatus(res, job.status());
      return;
    }
    ReplyJson(res, ProtoJson(*job));
  });

  post("/api/jobs/([^/]+)/resume", [this](const httplib::Request& req, httplib::Response& res) {
    int epochs = 0;
    int64_t checkpoint_id = 0;
    if (absl::Status s = ParseResume(req.body, &epochs, &checkpoint_id); !s.ok()) {
      ReplyStatus(res, s);
      return;
    }
    absl::StatusOr<v1::Job> job = jobs_->Resume(req.matches[1], epochs, checkpoint_id);
    if (!job.ok()) {
      ReplyStatus(res, job.status());
      return;
    }
    ReplyJson(res, ProtoJson(*job));
  });

  // Answered once the checkpoint is on disk (after the job's current step), as CreateCheckpoint.
  post("/api/jobs/([^/]+)/checkpoint", [this](const httplib::Request& req, httplib::Response& res) {
    // Shared with the training thread, which may call back after this request gave up.
    auto written = std::make_shared<std::promise<absl::StatusOr<v1::Checkpoint>>>();
    std::future<absl::StatusOr<v1::Checkpoint>> result = written->get_future();
    jobs_->RequestCheckpoint(req.matches[1], [written](absl::StatusOr<v1::Checkpoint> c) {
      written->set_value(std::move(c));
    });
    if (result.wait_for(absl::ToChronoNanoseconds(options_.checkpoint_timeout)) !=
        std::future_status::ready) {
      http::ReplyError(res, 504,
                       absl::StrCat("the checkpoint was not written within ",
                                    absl::FormatDuration(options_.checkpoint_timeout),
                                    "; it may still be (see the job's checkpoints)"));
      return;
    }
    absl::StatusOr<v1::Checkpoint> checkpoint = result.get();
    if (!checkpoint.ok()) {
      ReplyStatus(res, checkpoint.status());
      return;
    }
    ReplyJson(res, ProtoJson(*checkpoint));
  });

  get("/api/events", [this](const httplib::Request&, httplib::Response& res) {
    std::unique_ptr<SseStreamLimit::Slot> slot = AcquireStreamSlot(streams_, res);
    if (slot == nullptr) return;
    SseStream::Start(res, std::make_shared<JobsFeedStream>(feed_, std::move(slot), &streams_));
  });

  // The repository's index with each model's serving numbers from the metrics registry.
  get("/api/models", [this](const httplib::Request&, httplib::Response& res) {
    std::map<std::string, json> by_name;
    for (const serving::ModelIndexEntry& entry : models_->Index()) {
      json& model = by_name[entry.name];
      if (model.is_null()) {
        model = {{"name", entry.name},
                 {"versions", json::array()},
                 {"requests", 0},
                 {"failed_requests", 0},
                 {"latency_seconds", {{"p50", 0}, {"p90", 0}, {"p99", 0}}}};
      }
      json version = {{"version", entry.version},
                      {"state", entry.state},
                      {"reason", entry.reason},
                      {"source", ""}};
      if (!entry.version.empty()) {
        absl::StatusOr<std::shared_ptr<const serving::ServedVersion>> served =
            models_->Find(entry.name, entry.version);
        if (served.ok()) version["source"] = (*served)->source();
      }
      model["versions"].push_back(std::move(version));
    }
    for (const server::InferenceModelStats& stats : metrics_->InferenceStats()) {
      auto it = by_name.find(stats.model);
      if (it == by_name.end()) continue;  // undeployed; its series go with it
      it->second["requests"] = stats.requests;
      it->second["failed_requests"] = stats.failed_requests;
      it->second["latency_seconds"] = {
          {"p50", stats.p50_seconds}, {"p90", stats.p90_seconds}, {"p99", stats.p99_seconds}};
    }
    json models = json::array();
    for (auto& [name, model] : by_name) models.push_back(std::move(model));
    ReplyJson(res, json{{"models", models}}.dump(-1, ' ', false, json::error_handler_t::replace));
  });
}

}  // namespace kiln::web
