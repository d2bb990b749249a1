#include "server/web/web_api.h"

#include <httplib.h>

#include <cstdint>
#include <future>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/json_bounds.h"
#include "engine/precision.h"
#include "nlohmann/json.hpp"
#include "server/web/api_replies.h"

namespace kiln::web {
namespace {

using http::Access;
using nlohmann::json;

constexpr int kDefaultPageSize = 100;
constexpr int kMaxPageSize = 1000;
constexpr int kExportChunkBytes = 1 << 20;

const std::vector<WebApiRoute>& Routes() {
  static const auto* routes = new std::vector<WebApiRoute>{
      {"GET", "/api/jobs", "/api/jobs"},
      {"GET", "/api/jobs/([^/]+)", "/api/jobs/job-0"},
      {"POST", "/api/jobs/([^/]+)/cancel", "/api/jobs/job-0/cancel"},
      {"POST", "/api/jobs/([^/]+)/resume", "/api/jobs/job-0/resume"},
      {"GET", "/api/jobs/([^/]+)/checkpoints", "/api/jobs/job-0/checkpoints"},
      {"GET", R"(/api/jobs/([^/]+)/checkpoints/(\d+)/file)", "/api/jobs/job-0/checkpoints/1/file"},
      {"POST", "/api/jobs/([^/]+)/checkpoint", "/api/jobs/job-0/checkpoint"},
      {"GET", "/api/jobs/([^/]+)/events", "/api/jobs/job-0/events"},
      {"GET", "/api/events", "/api/events"},
      {"GET", "/api/models", "/api/models"},
  };
  return *routes;
}

// The resume request's body: empty, or {"epochs": N, "checkpoint_id": M}, both optional.
absl::Status ParseResume(const std::string& body, int* epochs, int64_t* checkpoint_id) {
  if (body.empty()) return absl::OkStatus();
  if (absl::Status depth = CheckJsonDepth(body, "the request body"); !depth.ok()) return depth;
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

WebApi::WebApi(server::JobAccess* jobs, server::MetricBroadcaster* broadcaster,
               serving::ModelRepository* models, server::Metrics* metrics, JobsFeed* feed,
               WebApiOptions options)
    : jobs_(jobs),
      broadcaster_(broadcaster),
      models_(models),
      metrics_(metrics),
      feed_(feed),
      options_(options),
      long_answers_(options.max_long_answers) {}

void WebApi::AddRoutes(http::HttpServer* server) {
  AddJobRoutes(server);
  AddCheckpointRoutes(server);
  AddEventRoutes(server);
  AddModelRoutes(server);
}

std::unique_ptr<LongAnswerLimit::Slot> WebApi::AcquireLongAnswer(httplib::Response& res) {
  std::unique_ptr<LongAnswerLimit::Slot> slot = long_answers_.Acquire();
  if (slot == nullptr) {
    http::ReplyError(res, 503,
                     absl::StrCat("too many event streams and downloads open (",
                                  long_answers_.max_streams(), "); try again later"));
  }
  return slot;
}

void WebApi::Get(http::HttpServer* server, const std::string& pattern,
                 http::HttpServer::Handler handler) {
  registered_.push_back({"GET", pattern});
  server->Get(pattern, Access::kToken, std::move(handler));
}

void WebApi::Post(http::HttpServer* server, const std::string& pattern,
                  http::HttpServer::Handler handler) {
  registered_.push_back({"POST", pattern});
  server->Post(pattern, Access::kToken, std::move(handler));
}

void WebApi::AddJobRoutes(http::HttpServer* server) {
  Get(server, "/api/jobs",
      [this](const httplib::Request& req, httplib::Response& res, const server::Caller& caller) {
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
            jobs_->List(caller, {}, page_size, req.get_param_value("page_token"));
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

  Get(server, "/api/jobs/([^/]+)",
      [this](const httplib::Request& req, httplib::Response& res, const server::Caller& caller) {
        ReplyMessage(res, jobs_->Get(caller, req.matches[1]));
      });

  Post(server, "/api/jobs/([^/]+)/cancel",
       [this](const httplib::Request& req, httplib::Response& res, const server::Caller& caller) {
         ReplyMessage(res, jobs_->Cancel(caller, req.matches[1]));
       });

  Post(server, "/api/jobs/([^/]+)/resume",
       [this](const httplib::Request& req, httplib::Response& res, const server::Caller& caller) {
         int epochs = 0;
         int64_t checkpoint_id = 0;
         if (absl::Status s = ParseResume(req.body, &epochs, &checkpoint_id); !s.ok()) {
           ReplyStatus(res, s);
           return;
         }
         ReplyMessage(res, jobs_->Resume(caller, req.matches[1], epochs, checkpoint_id));
       });
}

void WebApi::AddCheckpointRoutes(http::HttpServer* server) {
  Get(server, "/api/jobs/([^/]+)/checkpoints",
      [this](const httplib::Request& req, httplib::Response& res, const server::Caller& caller) {
        absl::StatusOr<std::vector<v1::Checkpoint>> list =
            jobs_->ListCheckpoints(caller, req.matches[1]);
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
  Get(server, R"(/api/jobs/([^/]+)/checkpoints/(\d+)/file)",
      [this](const httplib::Request& req, httplib::Response& res, const server::Caller& caller) {
        int64_t checkpoint_id = 0;
        if (!absl::SimpleAtoi(req.matches[2].str(), &checkpoint_id)) {
          http::ReplyError(res, 400, "checkpoint id: not a number");
          return;
        }
        const std::string job_id = req.matches[1];
        // Before the file is opened: a download past the limit costs no descriptor.
        std::shared_ptr<LongAnswerLimit::Slot> slot = AcquireLongAnswer(res);
        if (slot == nullptr) return;
        absl::StatusOr<std::unique_ptr<server::CheckpointExport>> source =
            jobs_->ExportCheckpoint(caller, job_id, checkpoint_id, kExportChunkBytes);
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
            "application/octet-stream", [file, slot](size_t, httplib::DataSink& sink) {
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

  // Answered once the checkpoint is on disk (after the job's current step), as CreateCheckpoint.
  Post(server, "/api/jobs/([^/]+)/checkpoint",
       [this](const httplib::Request& req, httplib::Response& res, const server::Caller& caller) {
         // Shared with the training thread, which may call back after this request gave up.
         auto written = std::make_shared<std::promise<absl::StatusOr<v1::Checkpoint>>>();
         std::future<absl::StatusOr<v1::Checkpoint>> result = written->get_future();
         jobs_->RequestCheckpoint(
             caller, req.matches[1],
             [written](absl::StatusOr<v1::Checkpoint> c) { written->set_value(std::move(c)); });
         if (result.wait_for(absl::ToChronoNanoseconds(options_.checkpoint_timeout)) !=
             std::future_status::ready) {
           http::ReplyError(res, 504,
                            absl::StrCat("the checkpoint was not written within ",
                                         absl::FormatDuration(options_.checkpoint_timeout),
                                         "; it may still be (see the job's checkpoints)"));
           return;
         }
         ReplyMessage(res, result.get());
       });
}

void WebApi::AddModelRoutes(http::HttpServer* server) {
  // The repository's index with each model's serving numbers from the metrics registry.
  Get(server, "/api/models",
      [this](const httplib::Request&, httplib::Response& res, const server::Caller& caller) {
        std::map<std::string, json> by_name;
        for (const serving::ModelIndexEntry& entry : models_->IndexFor(caller)) {
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
                          {"source", ""},
                          {"precision", ""}};
          if (!entry.version.empty()) {
            absl::StatusOr<std::shared_ptr<const serving::ServedVersion>> served =
                models_->Find(entry.name, entry.version);
            if (served.ok()) {
              version["source"] = (*served)->source();
              version["precision"] = std::string(PrecisionName((*served)->options().precision));
            }
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
        ReplyJson(res,
                  json{{"models", models}}.dump(-1, ' ', false, json::error_handler_t::replace));
      });
}

}  // namespace kiln::web
