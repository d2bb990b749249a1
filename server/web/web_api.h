// The JSON API behind kilnd's web page, on kilnd's HTTP listener under /api: jobs, their
// checkpoints and actions, served models with their serving numbers, and live updates as
// Server-Sent Events. A thin translator like the gRPC services: each route validates, calls the
// same JobAccess / ModelRepository / Metrics call the gRPC side calls, and maps absl::Status to
// an HTTP status with a JSON error {"error": ...}. Messages are proto3 JSON (snake_case names,
// enums by name, 64-bit integers as strings). Deploy, undeploy and inference use the KServe v2
// REST routes (/v2/repository/..., /v2/models/.../infer), which already exist.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "server/access/job_access.h"
#include "server/http/http_server.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/metric_broadcaster.h"
#include "server/observability/metrics.h"
#include "server/serving/model_repository.h"
#include "server/web/jobs_feed.h"
#include "server/web/long_answer_limit.h"

namespace kiln::web {

struct WebApiOptions {
  // Event streams and checkpoint downloads open at once (each holds an HTTP thread); more are
  // answered 503.
  int max_long_answers = 4;
  // An event stream ends after this with an "end" event of code DEADLINE_EXCEEDED.
  absl::Duration max_stream_duration = absl::Minutes(5);
  // How long POST /api/jobs/{id}/checkpoint waits for the checkpoint (504 after).
  absl::Duration checkpoint_timeout = absl::Seconds(60);
};

// One route, for documentation and for tests that must cover every route (e.g. that each is
// refused without a token): its method, its pattern, and a path that matches it. Tests check
// that this list is what AddRoutes registers.
struct WebApiRoute {
  std::string method;  // "GET" or "POST"
  std::string pattern;
  std::string example_path;
};
const std::vector<WebApiRoute>& WebApiRoutes();

// Every pointer must outlive the HttpServer the routes are added to. Thread-safe.
class WebApi {
 public:
  WebApi(server::JobAccess* jobs, server::MetricBroadcaster* broadcaster,
         serving::ModelRepository* models, server::Metrics* metrics, JobsFeed* feed,
         WebApiOptions options = {});

  // Adds the /api routes (every one behind the server's bearer tokens) to `server`.
  void AddRoutes(http::HttpServer* server);
  // Open event streams end at their next turn (within a fraction of a second) with an "end"
  // event; new ones are refused. Waits for them up to a second. Call before HttpServer::Stop,
  // which would also end them, but cut off.
  void Stop() { long_answers_.Stop(absl::Seconds(1)); }
  // (method, pattern) of each route AddRoutes added, in order.
  const std::vector<std::pair<std::string, std::string>>& registered_routes() const {
    return registered_;
  }

 private:
  // The routes of each resource; AddRoutes adds them all.
  void AddJobRoutes(http::HttpServer* server);         // list, get, cancel, resume
  void AddCheckpointRoutes(http::HttpServer* server);  // list, download, create
  void AddEventRoutes(http::HttpServer* server);       // event_routes.cc: the live streams
  void AddModelRoutes(http::HttpServer* server);       // the served models with their numbers
  // A place for one more long answer (a stream or a download), or null with `res` answered 503.
  std::unique_ptr<LongAnswerLimit::Slot> AcquireLongAnswer(httplib::Response& res);
  // Adds a route behind the server's bearer tokens (when tokens are on) and records it for
  // registered_routes.
  void Get(http::HttpServer* server, const std::string& pattern, http::HttpServer::Handler handler);
  void Post(http::HttpServer* server, const std::string& pattern,
            http::HttpServer::Handler handler);

  server::JobAccess* jobs_;
  server::MetricBroadcaster* broadcaster_;
  serving::ModelRepository* models_;
  server::Metrics* metrics_;
  JobsFeed* feed_;
  const WebApiOptions options_;
  LongAnswerLimit long_answers_;
  std::vector<std::pair<std::string, std::string>> registered_;
};

}  // namespace kiln::web
