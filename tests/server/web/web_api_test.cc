// The web page's JSON API (server/web) on an in-process kilnd with bearer tokens on, driven over
// HTTP with httplib's client: every route refused without a token, bad input answered with a
// JSON error naming what is wrong, event streams (history, live, bounded, ended by shutdown),
// and the page's own files served.
#include "server/web/web_api.h"

#include <httplib.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/daemon.h"
#include "server_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::server {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;
using testing::SmallSpec;
using testing::WaitFor;

constexpr char kToken[] = "web-api-test-token";

class WebApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::MakeTempDir("kilnd-web");
    options_.listen = "127.0.0.1:0";
    options_.metrics_listen = "127.0.0.1:0";
    options_.state_dir = root_ + "/state";
    options_.data_dir = root_ + "/data";
    options_.device = "cpu";
    options_.auth_tokens_file = root_ + "/tokens";
    options_.log_stream = nullptr;
    std::ofstream(options_.auth_tokens_file) << kToken << "\n";
    testing::WriteToyDataset(options_.data_dir + "/toy", 256, 64);
  }
  void TearDown() override {
    daemon_.reset();
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  void StartDaemon() {
    auto daemon = Daemon::Start(options_);
    ASSERT_OK(daemon) << daemon.status();
    daemon_ = *std::move(daemon);
  }
  std::unique_ptr<httplib::Client> NewClient() const {
    auto client = std::make_unique<httplib::Client>("127.0.0.1", daemon_->metrics_port());
    client->set_read_timeout(60, 0);
    return client;
  }
  httplib::Headers Auth() const { return {{"Authorization", absl::StrCat("Bearer ", kToken)}}; }

  // The body of `path` read to its end (an event stream until the server ends it).
  std::string ReadAll(const std::string& path, int* status) const {
    std::string body;
    auto res = NewClient()->Get(path, Auth(), [&](const char* data, size_t n) {
      body.append(data, n);
      return true;
    });
    *status = res ? res->status : -1;
    return body;
  }

  std::string root_;
  DaemonOptions options_;
  std::unique_ptr<Daemon> daemon_;
};

TEST_F(WebApiTest, EveryApiRouteRefusesARequestWithoutAValidToken) {
  StartDaemon();
  auto client = NewClient();
  // The list covers what kilnd registers, no more and no less.
  std::vector<std::pair<std::string, std::string>> listed;
  for (const web::WebApiRoute& route : web::WebApiRoutes()) {
    listed.emplace_back(route.method, route.pattern);
  }
  ASSERT_NE(daemon_->web_api(), nullptr);
  EXPECT_THAT(daemon_->web_api()->registered_routes(),
              ::testing::UnorderedElementsAreArray(listed));
  ASSERT_GE(listed.size(), 10u);
  for (const web::WebApiRoute& route : web::WebApiRoutes()) {
    // The example path is one the route itself answers.
    EXPECT_TRUE(std::regex_match(route.example_path, std::regex(route.pattern))) << route.pattern;
    for (const httplib::Headers& headers :
         {httplib::Headers{}, httplib::Headers{{"Authorization", "Bearer not-the-token"}}}) {
      auto res = route.method == "GET"
                     ? client->Get(route.example_path, headers)
                     : client->Post(route.example_path, headers, "{}", "application/json");
      ASSERT_TRUE(res) << route.example_path;
      EXPECT_EQ(res->status, 401) << route.method << " " << route.example_path;
      EXPECT_THAT(json::parse(res->body).at("error").get<std::string>(), HasSubstr("token"))
          << route.example_path;
    }
  }
}

TEST_F(WebApiTest, AStreamBoundOutsideHalfTheHttpThreadsStopsKilndAtStart) {
  for (int streams : {0, 9}) {
    options_.max_web_long_answers = streams;
    absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(options_);
    ASSERT_FALSE(daemon.ok()) << streams;
    EXPECT_EQ(daemon.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(daemon.status().message()),
                HasSubstr(absl::StrCat("--max_web_streams: must be in [1, 8]")));
  }
}

TEST_F(WebApiTest, ThePageItselfIsServedWithoutAToken) {
  StartDaemon();
  auto client = NewClient();
  for (const char* path : {"/", "/web/app.js", "/web/app.css"}) {
    auto res = client->Get(path);
    ASSERT_TRUE(res) << path;
    EXPECT_EQ(res->status, 200) << path;
    EXPECT_FALSE(res->body.empty()) << path;
  }
  EXPECT_THAT(client->Get("/")->get_header_value("Content-Type"), HasSubstr("text/html"));
  EXPECT_THAT(client->Get("/")->body, HasSubstr("/web/app.js"));
  // Compressed from the cache (once per file and encoding), never per request: the answer says
  // so, and decodes to the same file.
  const std::string plain = client->Get("/web/app.js")->body;
  // The port answers a client that accepts only br uncompressed and one that accepts gzip with
  // gzip (server/http: httplib's brotli is too slow to offer).
  for (const auto& [accept, encoding] :
       {std::pair<const char*, const char*>{"gzip", "gzip"}, {"gzip, br", "gzip"}, {"br", ""}}) {
    auto res = client->Get("/web/app.js", {{"Accept-Encoding", accept}});
    ASSERT_TRUE(res) << accept;
    EXPECT_EQ(res->get_header_value("Content-Encoding"), encoding);
    EXPECT_EQ(res->get_header_value("Vary"), "Accept-Encoding");
    EXPECT_EQ(res->body, plain) << accept;  // httplib's client decodes it
  }
  // It runs only its own files and no other site may frame it (it holds a token).
  EXPECT_THAT(
      client->Get("/")->get_header_value("Content-Security-Policy"),
      ::testing::AllOf(HasSubstr("default-src 'self'"), HasSubstr("frame-ancestors 'none'")));
}

TEST_F(WebApiTest, BadInputGetsAJsonErrorNamingWhatIsWrong) {
  StartDaemon();
  auto client = NewClient();
  auto unknown = client->Get("/api/jobs/job-nope", Auth());
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  EXPECT_THAT(json::parse(unknown->body).at("error").get<std::string>(), HasSubstr("job-nope"));

  auto checkpoint = client->Post("/api/jobs/job-nope/checkpoint", Auth(), "", "application/json");
  ASSERT_TRUE(checkpoint);
  EXPECT_EQ(checkpoint->status, 404);

  const std::string job = daemon_->manager().Submit(SmallSpec("toy", 1))->id();
  const std::string resume = absl::StrCat("/api/jobs/", job, "/resume");
  for (const auto& [body, message] : std::vector<std::pair<std::string, std::string>>{
           {"{", "not a JSON object"},
           {R"({"epochs": "3"})", "epochs: must be an integer"},
           {R"({"checkpoint_id": -1})", "checkpoint_id: must be 0"},
           {R"({"epoch": 3})", "epoch: not a field"},
           {std::string(80'000, '[') + std::string(80'000, ']'), "deeper than 64 levels"}}) {
    auto res = client->Post(resume, Auth(), body, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << body;
    EXPECT_THAT(json::parse(res->body).at("error").get<std::string>(), HasSubstr(message)) << body;
  }
  auto flag = client->Get(absl::StrCat("/api/jobs/", job, "/events?steps=2"), Auth());
  ASSERT_TRUE(flag);
  EXPECT_EQ(flag->status, 400);
  EXPECT_THAT(json::parse(flag->body).at("error").get<std::string>(), HasSubstr("steps"));
  auto page_size = client->Get("/api/jobs?page_size=0", Auth());
  ASSERT_TRUE(page_size);
  EXPECT_EQ(page_size->status, 400);
  auto no_route = client->Get("/api/nothing", Auth());
  ASSERT_TRUE(no_route);
  EXPECT_EQ(no_route->status, 404);
  EXPECT_THAT(json::parse(no_route->body).at("error").get<std::string>(), HasSubstr("/api"));
}

TEST_F(WebApiTest, JobsAndCheckpointsAreTheJobManagersAsJson) {
  StartDaemon();
  const std::string first = daemon_->manager().Submit(SmallSpec("toy", 1))->id();
  const std::string second = daemon_->manager().Submit(SmallSpec("toy", 1))->id();
  ASSERT_TRUE(
      WaitFor([&] { return daemon_->manager().Get(second)->state() == v1::JOB_STATE_SUCCEEDED; },
              absl::Seconds(120)));
  auto client = NewClient();
  auto list = client->Get("/api/jobs", Auth());
  ASSERT_TRUE(list);
  ASSERT_EQ(list->status, 200);
  const json jobs = json::parse(list->body).at("jobs");
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[0].at("id"), second);  // newest first, as `kiln jobs`
  EXPECT_EQ(jobs[1].at("id"), first);
  EXPECT_EQ(jobs[0].at("state"), "JOB_STATE_SUCCEEDED");
  EXPECT_EQ(jobs[0].at("spec").at("dataset"), "toy");

  auto checkpoints = client->Get(absl::StrCat("/api/jobs/", second, "/checkpoints"), Auth());
  ASSERT_TRUE(checkpoints);
  const json list_json = json::parse(checkpoints->body).at("checkpoints");
  ASSERT_FALSE(list_json.empty());
  const std::string id = list_json.back().at("id");
  auto file = client->Get(absl::StrCat("/api/jobs/", second, "/checkpoints/", id, "/file"), Auth());
  ASSERT_TRUE(file);
  EXPECT_EQ(file->status, 200);
  EXPECT_EQ(std::to_string(file->body.size()),
            list_json.back().at("size_bytes").get<std::string>());

  auto models = client->Get("/api/models", Auth());
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body), json::parse(R"({"models": []})"));

  // A version loaded in bf16, as the page's deploy (or `kiln deploy --precision bf16`) loads it:
  // the models' list says so beside its source.
  const std::string load_body =
      json{{"parameters", {{"checkpoint", second + "@latest"}, {"precision", "bf16"}}}}.dump();
  auto load = client->Post("/v2/repository/models/toy-bf16/load", Auth(), load_body,
                           "application/json");
  ASSERT_TRUE(load);
  ASSERT_EQ(load->status, 200) << load->body;
  models = client->Get("/api/models", Auth());
  ASSERT_TRUE(models);
  const json listed = json::parse(models->body).at("models");
  ASSERT_EQ(listed.size(), 1u) << models->body;
  EXPECT_EQ(listed[0].at("name"), "toy-bf16");
  EXPECT_EQ(listed[0].at("versions")[0].at("precision"), "bf16") << models->body;
}

TEST_F(WebApiTest, APresetJobCarriesItsResolvedRecipeAlsoAfterARestart) {
  StartDaemon();
  v1::JobSpec spec;
  spec.set_preset("mnist-cnn");
  spec.set_dataset("toy");
  spec.set_epochs(1);
  auto submitted = daemon_->manager().Submit(spec);
  ASSERT_OK(submitted) << submitted.status();
  const std::string id = submitted->id();
  ASSERT_TRUE(
      WaitFor([&] { return daemon_->manager().Get(id)->state() == v1::JOB_STATE_SUCCEEDED; },
              absl::Seconds(120)));
  auto expect_recipe = [&](const std::string& when) {
    auto res = NewClient()->Get(absl::StrCat("/api/jobs/", id), Auth());
    ASSERT_TRUE(res) << when;
    ASSERT_EQ(res->status, 200) << when;
    const json job = json::parse(res->body);
    EXPECT_EQ(job.at("spec").at("batch_size"), 0) << when;  // as submitted
    const json& recipe = job.at("resolved_spec");
    EXPECT_EQ(recipe.at("batch_size"), 64) << when;
    EXPECT_EQ(recipe.at("optimizer").at("kind"), "KIND_ADAM") << when;
    EXPECT_NEAR(recipe.at("optimizer").at("lr").get<double>(), 0.001, 1e-7) << when;
    EXPECT_EQ(recipe.at("preset"), "mnist-cnn") << when;
    auto list = NewClient()->Get("/api/jobs", Auth());
    ASSERT_TRUE(list) << when;
    EXPECT_EQ(json::parse(list->body).at("jobs").at(0).at("resolved_spec").at("batch_size"), 64)
        << when;
  };
  expect_recipe("while kilnd runs");
  // The store holds the spec as submitted only: a restarted kilnd works the recipe out again.
  daemon_.reset();
  StartDaemon();
  expect_recipe("after a restart");
}

TEST_F(WebApiTest, CheckpointCancelAndResumeActOnTheJob) {
  options_.step_delay = absl::Milliseconds(20);
  StartDaemon();
  const std::string job = daemon_->manager().Submit(SmallSpec("toy", 50))->id();
  ASSERT_TRUE(WaitFor([&] { return daemon_->manager().Get(job)->state() == v1::JOB_STATE_RUNNING; },
                      absl::Seconds(60)));
  auto client = NewClient();
  const std::string path = absl::StrCat("/api/jobs/", job);
  auto checkpoint = client->Post(path + "/checkpoint", Auth(), "", "application/json");
  ASSERT_TRUE(checkpoint);
  ASSERT_EQ(checkpoint->status, 200) << checkpoint->body;
  const json written = json::parse(checkpoint->body);
  EXPECT_EQ(written.at("kind"), "CHECKPOINT_KIND_ON_DEMAND");
  EXPECT_EQ(written.at("job_id"), job);
  EXPECT_EQ(daemon_->manager().ListCheckpoints(job)->back().id(),
            std::stoll(written.at("id").get<std::string>()));

  auto cancelled = client->Post(path + "/cancel", Auth(), "", "application/json");
  ASSERT_TRUE(cancelled);
  ASSERT_EQ(cancelled->status, 200) << cancelled->body;
  ASSERT_TRUE(
      WaitFor([&] { return daemon_->manager().Get(job)->state() == v1::JOB_STATE_CANCELLED; },
              absl::Seconds(60)));
  auto resumed = client->Post(path + "/resume", Auth(), R"({"epochs": 60})", "application/json");
  ASSERT_TRUE(resumed);
  ASSERT_EQ(resumed->status, 200) << resumed->body;
  EXPECT_EQ(json::parse(resumed->body).at("epochs"), 60);
  EXPECT_EQ(daemon_->manager().Get(job)->epochs(), 60);
  // Cancelling an ended job is the manager's refusal, as on gRPC.
  ASSERT_TRUE(client->Post(path + "/cancel", Auth(), "", "application/json"));
  ASSERT_TRUE(
      WaitFor([&] { return daemon_->manager().Get(job)->state() == v1::JOB_STATE_CANCELLED; },
              absl::Seconds(60)));
  auto again = client->Post(path + "/cancel", Auth(), "", "application/json");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 400) << again->body;
}

TEST_F(WebApiTest, AJobsEventStreamReplaysItsHistoryThenEnds) {
  StartDaemon();
  const std::string job = daemon_->manager().Submit(SmallSpec("toy", 2))->id();
  int status = 0;
  // Followed live from the start to the job's end.
  const std::string body = ReadAll(absl::StrCat("/api/jobs/", job, "/events"), &status);
  EXPECT_EQ(status, 200);
  EXPECT_THAT(body, HasSubstr("\"step\":"));
  EXPECT_THAT(body, HasSubstr("\"epoch\":"));
  EXPECT_THAT(body, HasSubstr("event: history_end"));
  EXPECT_THAT(body, HasSubstr("JOB_STATE_SUCCEEDED"));
  EXPECT_THAT(body,
              ::testing::EndsWith("event: end\ndata: {\"code\":\"OK\",\"message\":\"\"}\n\n"));

  // Once it ended, the same stream is its recorded history: every step of two epochs (256
  // samples of batch 32), all marked replayed.
  const std::string replay = ReadAll(absl::StrCat("/api/jobs/", job, "/events?steps=1"), &status);
  int steps = 0;
  for (size_t at = replay.find("\"step\":{"); at != std::string::npos;
       at = replay.find("\"step\":{", at + 1)) {
    ++steps;
  }
  EXPECT_EQ(steps, 16);
  EXPECT_THAT(replay, ::testing::Not(HasSubstr("\"replayed\":false")));
  const std::string no_steps = ReadAll(absl::StrCat("/api/jobs/", job, "/events?steps=0"), &status);
  EXPECT_THAT(no_steps, ::testing::Not(HasSubstr("\"step\":{")));
  EXPECT_THAT(no_steps, HasSubstr("\"epoch\":{"));
}

TEST_F(WebApiTest, EventStreamsAreBoundedAndEndWhenKilndStops) {
  options_.max_web_long_answers = 1;
  options_.step_delay = absl::Milliseconds(20);
  StartDaemon();
  const std::string job = daemon_->manager().Submit(SmallSpec("toy", 50))->id();
  // The one stream allowed: the jobs feed, open until kilnd stops.
  std::atomic<bool> opened{false}, saw_change{false};
  std::string feed;
  int feed_status = 0;
  std::thread reader([&] {
    auto res = NewClient()->Get("/api/events", Auth(), [&](const char* data, size_t n) {
      feed.append(data, n);
      if (feed.find("event: open") != std::string::npos) opened = true;
      if (feed.find(job) != std::string::npos) saw_change = true;
      return true;
    });
    feed_status = res ? res->status : -1;
  });
  ASSERT_TRUE(WaitFor([&] { return opened.load(); }, absl::Seconds(30)));
  ASSERT_TRUE(WaitFor([&] { return saw_change.load(); }, absl::Seconds(30)));

  auto client = NewClient();
  auto refused = client->Get(absl::StrCat("/api/jobs/", job, "/events"), Auth());
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503);
  EXPECT_THAT(json::parse(refused->body).at("error").get<std::string>(),
              HasSubstr("too many event streams"));
  // The rest of the port is not starved.
  auto metrics = client->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);

  ASSERT_OK(daemon_->Shutdown(absl::Seconds(30)));
  reader.join();
  EXPECT_EQ(feed_status, 200);
  EXPECT_THAT(feed, HasSubstr("event: end"));
  EXPECT_THAT(feed, HasSubstr("kilnd is stopping"));
}

// A client that never reads held a stream's place for as long as kilnd ran: a stream now ends
// after --web_stream_max_duration with an "end" event the page answers by opening it again.
TEST_F(WebApiTest, AnEventStreamEndsAfterItsLongestDurationAndFreesItsPlace) {
  options_.max_web_long_answers = 1;
  options_.web_stream_max_duration = absl::Seconds(1);
  StartDaemon();
  int status = 0;
  const absl::Time start = absl::Now();
  const std::string feed = ReadAll("/api/events", &status);
  EXPECT_EQ(status, 200);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_THAT(feed, HasSubstr("event: end"));
  EXPECT_THAT(feed, HasSubstr("DEADLINE_EXCEEDED"));
  EXPECT_THAT(feed, HasSubstr("open it again"));
  // Its place is free again.
  EXPECT_THAT(ReadAll("/api/events", &status), HasSubstr("DEADLINE_EXCEEDED"));
  EXPECT_EQ(status, 200);
}

// Checkpoint downloads held HTTP threads without a bound (16 slow downloads took them all):
// they now take the same places as event streams.
TEST_F(WebApiTest, ACheckpointDownloadTakesALongAnswerPlace) {
  options_.max_web_long_answers = 1;
  StartDaemon();
  const std::string job = daemon_->manager().Submit(SmallSpec("toy", 1))->id();
  ASSERT_TRUE(
      WaitFor([&] { return daemon_->manager().Get(job)->state() == v1::JOB_STATE_SUCCEEDED; },
              absl::Seconds(120)));
  auto client = NewClient();
  auto checkpoints = client->Get(absl::StrCat("/api/jobs/", job, "/checkpoints"), Auth());
  ASSERT_TRUE(checkpoints);
  const std::string id = json::parse(checkpoints->body).at("checkpoints").back().at("id");
  const std::string file_path = absl::StrCat("/api/jobs/", job, "/checkpoints/", id, "/file");
  auto alone = client->Get(file_path, Auth());
  ASSERT_TRUE(alone);
  EXPECT_EQ(alone->status, 200);

  std::atomic<bool> opened{false}, done{false};
  std::thread reader([&] {
    NewClient()->Get("/api/events", Auth(), [&](const char* data, size_t n) {
      if (std::string(data, n).find("event: open") != std::string::npos) opened = true;
      return !done.load();
    });
  });
  ASSERT_TRUE(WaitFor([&] { return opened.load(); }, absl::Seconds(30)));
  auto refused = client->Get(file_path, Auth());
  done = true;
  reader.join();
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503);
  EXPECT_THAT(json::parse(refused->body).at("error").get<std::string>(),
              HasSubstr("too many event streams and downloads open (1)"));
}

}  // namespace
}  // namespace kiln::server
