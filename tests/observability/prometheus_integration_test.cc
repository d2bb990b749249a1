// A real Prometheus scraping a real kilnd (a subprocess) that trains a small job on generated IDX
// data: the values Prometheus stored match what WatchJob streamed, the scrape passes
// `promtool check metrics`, every PromQL query of the Grafana dashboard returns data, and the
// event log has one JSON line per event. Skips when prometheus is not installed.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inference/grpc_service.grpc.pb.h"
#include "prometheus_harness.h"
#include "server/observability/metrics.h"
#include "server_test_support.h"
#include "tests/support/connected_channel.h"
#include "tests/support/status_matchers.h"

namespace kiln::server {
namespace {
namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int kTrainSamples = 1024, kTestSamples = 256, kEpochs = 3, kBatch = 32;
constexpr int kSteps = kEpochs * (kTrainSamples / kBatch);
constexpr int kWorkerEpochs = 3;

std::string SourcePath(const std::string& relative) {
  return absl::StrCat(KILN_SOURCE_DIR, "/", relative);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Every "expr" of every panel target, nested rows included.
void CollectExprs(const nlohmann::json& node, std::vector<std::string>* out) {
  if (node.is_object()) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (it.key() == "expr" && it.value().is_string()) {
        out->push_back(it.value());
      } else if (it.key() != "templating") {  // variable queries are label_values(), not PromQL
        CollectExprs(it.value(), out);
      }
    }
  } else if (node.is_array()) {
    for (const nlohmann::json& child : node) CollectExprs(child, out);
  }
}

nlohmann::json Dashboard() {
  return nlohmann::json::parse(ReadFile(SourcePath("deploy/grafana/dashboards/kiln.json")));
}

std::vector<std::string> DashboardExprs() {
  std::vector<std::string> exprs;
  CollectExprs(Dashboard()["panels"], &exprs);
  return exprs;
}

// The exprs of the panels titled as error rates, which must show 0, not "no data", while there
// are no errors.
std::vector<std::string> ErrorPanelExprs() {
  const nlohmann::json dashboard = Dashboard();
  std::vector<std::string> exprs;
  for (const nlohmann::json& panel : dashboard["panels"]) {
    if (absl::StrContains(absl::AsciiStrToLower(panel.value("title", "")), "error")) {
      CollectExprs(panel, &exprs);
    }
  }
  return exprs;
}

// Grafana's variables as Grafana would expand them for "All" over the last few minutes.
std::string ExpandGrafanaVariables(const std::string& expr) {
  return absl::StrReplaceAll(expr, {{"$__rate_interval", "1m"},
                                    {"$__interval", "15s"},
                                    {"$__range", "5m"},
                                    {"${job_id:regex}", ".*"},
                                    {"$job_id", ".*"},
                                    {"$model", ".*"}});
}

// The numbers of an instant query's vector result.
std::vector<double> Values(const nlohmann::json& data) {
  std::vector<double> values;
  if (data.value("resultType", "") == "scalar") {
    values.push_back(std::stod(data["result"][1].get<std::string>()));
    return values;
  }
  for (const nlohmann::json& r : data["result"]) {
    values.push_back(std::stod(r["value"][1].get<std::string>()));
  }
  return values;
}

bool AnyFinite(const std::vector<double>& values) {
  for (double v : values) {
    if (std::isfinite(v)) return true;
  }
  return false;
}

std::string PrometheusBinary() { return testing::FindProgram("prometheus"); }

#define SKIP_WITHOUT_PROMETHEUS()                                                          \
  if (PrometheusBinary().empty()) {                                                        \
    GTEST_SKIP() << "prometheus is not installed (scripts/install-deps installs Debian's " \
                    "prometheus); skipping the real-Prometheus test";                      \
  }

// One kilnd, one Prometheus scraping it every second, and one finished training job, shared by
// the tests of the suite.
class PrometheusIntegrationTest : public ::testing::Test {
 protected:
  struct Workload {
    std::string root;
    std::unique_ptr<testing::KilndWithMetrics> kilnd;
    std::unique_ptr<testing::PrometheusProcess> prometheus;
    std::string job_id;
    std::string workers_job_id;  // the job of two workers that ran after it
    std::vector<v1::JobEvent> events;
    std::string failure;  // set when the workload could not run
  };

  static void SetUpTestSuite() {
    if (PrometheusBinary().empty()) return;
    w_ = new Workload();
    w_->failure = RunWorkload(*w_);
  }
  static void TearDownTestSuite() {
    if (w_ == nullptr) return;
    w_->prometheus.reset();
    w_->kilnd.reset();
    std::error_code ec;
    fs::remove_all(w_->root, ec);
    delete w_;
    w_ = nullptr;
  }
  void SetUp() override {
    SKIP_WITHOUT_PROMETHEUS();
    ASSERT_NE(w_, nullptr);
    ASSERT_TRUE(w_->failure.empty()) << w_->failure;
  }

  static std::string RunWorkload(Workload& w) {
    w.root = testing::MakeTempDir("kiln-prometheus");
    testing::WriteToyDataset(w.root + "/data/toy", kTrainSamples, kTestSamples);
    w.kilnd = std::make_unique<testing::KilndWithMetrics>(
        w.root + "/state", w.root + "/data",
        std::vector<std::string>{"--step_delay=30ms", "--log_format=json",
                                 "--metrics_job_retention=10m"});
    if (!w.kilnd->Start()) return "kilnd did not start: " + w.kilnd->Stderr();
    w.prometheus = std::make_unique<testing::PrometheusProcess>(
        PrometheusBinary(), w.root + "/prometheus",
        std::vector<std::string>{absl::StrCat("127.0.0.1:", w.kilnd->metrics_port())});
    if (!w.prometheus->Start(absl::Seconds(60))) {
      return "prometheus did not start: " + w.prometheus->log();
    }
    // Train only once Prometheus scrapes kilnd, so it sees the job from its start.
    if (!WaitForValue(w, "up{job=\"kilnd\"}", [](double v) { return v == 1; })) {
      return "Prometheus never scraped kilnd: " + w.prometheus->log();
    }
    auto stub = w.kilnd->NewStub();
    grpc::ClientContext context;
    v1::SubmitJobRequest request;
    *request.mutable_spec() = testing::SmallSpec("toy", kEpochs);
    v1::Job job;
    grpc::Status status = stub->SubmitJob(&context, request, &job);
    if (!status.ok()) return "SubmitJob: " + status.error_message();
    w.job_id = job.id();
    // Steady GetJob traffic meanwhile, so the gRPC panels have rates (as a CLI polling would).
    std::atomic<bool> watched{false};
    std::thread poller([&] {
      while (!watched) {
        testing::GetJob(*stub, w.job_id);
        absl::SleepFor(absl::Milliseconds(100));
      }
    });
    testing::WatchResult watch = testing::WatchToEnd(*stub, job.id(), /*include_steps=*/true);
    watched = true;
    poller.join();
    if (!watch.status.ok()) return "WatchJob: " + watch.status.error_message();
    w.events = watch.events;
    // A job of two workers, so the data-parallel panels have series (per rank, allreduce), long
    // enough (kWorkerEpochs of 32 steps at 30 ms) for several scrapes to see its counters rise.
    {
      grpc::ClientContext workers_context;
      v1::SubmitJobRequest workers;
      *workers.mutable_spec() = testing::SmallSpec("toy", kWorkerEpochs);
      workers.mutable_spec()->set_workers(2);
      v1::Job workers_job;
      status = stub->SubmitJob(&workers_context, workers, &workers_job);
      if (!status.ok()) return "SubmitJob of 2 workers: " + status.error_message();
      w.workers_job_id = workers_job.id();
      testing::WatchResult done = testing::WatchToEnd(*stub, workers_job.id());
      if (!done.status.ok()) return "WatchJob of 2 workers: " + done.status.error_message();
      const v1::Job finished = testing::GetJob(*stub, workers_job.id());
      if (finished.state() != v1::JOB_STATE_SUCCEEDED) {
        return absl::StrCat("the job of 2 workers ended ", v1::JobState_Name(finished.state()),
                            ": ", finished.reason());
      }
    }
    // A failing call, so the gRPC panels have more than one code.
    grpc::ClientContext missing_context;
    v1::GetJobRequest missing;
    missing.set_job_id("job-none");
    stub->GetJob(&missing_context, missing, &job).error_code();
    // Serve the job and send some ModelInfer traffic (and one bad request), so the serving
    // series come from the real serving path.
    if (std::string err = ServeAndInfer(w); !err.empty()) return err;
    // Wait for a scrape after the job's end.
    const std::string step = absl::StrCat("kiln_training_step{job_id=\"", w.job_id, "\"}");
    if (!WaitForValue(w, step, [&](double v) { return v == kSteps; })) {
      return absl::StrCat("Prometheus never saw step ", kSteps, " of ", w.job_id);
    }
    if (!WaitForValue(w, "kiln_job_completions_total{state=\"succeeded\"}",
                      [](double v) { return v == 2; })) {
      return "Prometheus never saw the completion";
    }
    return "";
  }

  static std::string ServeAndInfer(Workload& w) {
    auto inference = inference::GRPCInferenceService::NewStub(
        kiln::testing::ConnectedChannel(absl::StrCat("127.0.0.1:", w.kilnd->port())));
    {
      grpc::ClientContext context;
      inference::RepositoryModelLoadRequest load;
      load.set_model_name("toy");
      (*load.mutable_parameters())["checkpoint"].set_string_param(w.job_id + "@latest");
      inference::RepositoryModelLoadResponse loaded;
      grpc::Status status = inference->RepositoryModelLoad(&context, load, &loaded);
      if (!status.ok()) return "RepositoryModelLoad: " + status.error_message();
    }
    for (int i = 0; i < 20; ++i) {
      grpc::ClientContext context;
      inference::ModelInferRequest request;
      request.set_model_name("toy");
      auto* input = request.add_inputs();
      input->set_name("input");
      input->set_datatype(i == 5 ? "FP16" : "UINT8");  // one bad request: INVALID_ARGUMENT
      input->add_shape(1);
      input->add_shape(28 * 28);
      request.add_raw_input_contents(std::string(28 * 28, static_cast<char>(i * 10)));
      inference::ModelInferResponse response;
      grpc::Status status = inference->ModelInfer(&context, request, &response);
      if (i != 5 && !status.ok()) return "ModelInfer: " + status.error_message();
      // Spread over several 1 s scrapes, so rate() panels see the counters rise.
      absl::SleepFor(absl::Milliseconds(200));
    }
    const std::string served = "kiln_inference_requests_total{model=\"toy\",code=\"OK\"}";
    if (!WaitForValue(w, served, [](double v) { return v == 19; })) {
      return "Prometheus never saw the 19 inference requests";
    }
    return "";
  }

  // Polls the instant query until its first value satisfies `ok`.
  static bool WaitForValue(Workload& w, const std::string& expr,
                           const std::function<bool(double)>& ok) {
    return testing::WaitFor(
        [&] {
          absl::StatusOr<nlohmann::json> data = w.prometheus->Query(expr);
          if (!data.ok()) return false;
          std::vector<double> values = Values(*data);
          absl::SleepFor(absl::Milliseconds(200));
          return !values.empty() && ok(values[0]);
        },
        absl::Seconds(60));
  }

  static double QueryOne(const std::string& expr) {
    absl::StatusOr<nlohmann::json> data = w_->prometheus->Query(expr);
    EXPECT_OK(data) << data.status();
    if (!data.ok()) return NAN;
    std::vector<double> values = Values(*data);
    EXPECT_EQ(values.size(), 1u) << expr << ": " << data->dump();
    return values.empty() ? NAN : values[0];
  }

  std::string ForJob(const std::string& metric) const {
    return absl::StrCat(metric, "{job_id=\"", w_->job_id, "\",model=\"custom\"}");
  }

  static Workload* w_;
};

PrometheusIntegrationTest::Workload* PrometheusIntegrationTest::w_ = nullptr;

TEST_F(PrometheusIntegrationTest, PrometheusStoredTheLossAndAccuracyWatchJobStreamed) {
  float last_loss = NAN;
  int64_t last_step = 0;
  double last_accuracy = NAN, last_sps = NAN;
  for (const v1::JobEvent& e : w_->events) {
    if (e.has_step()) {
      last_loss = e.step().loss();
      last_step = e.step().global_step();
    }
    if (e.has_epoch()) {
      last_accuracy = e.epoch().test_accuracy();
      last_sps = e.epoch().samples_per_sec();
    }
  }
  ASSERT_EQ(last_step, kSteps);
  EXPECT_NEAR(QueryOne(ForJob("kiln_training_loss")), last_loss, 1e-6 * std::max(1.0f, last_loss));
  EXPECT_NEAR(QueryOne(ForJob("kiln_training_test_accuracy")), last_accuracy, 1e-9);
  EXPECT_GT(last_accuracy, 0.5);  // the toy task is learnable
  EXPECT_EQ(QueryOne(ForJob("kiln_training_epoch")), kEpochs);
  EXPECT_EQ(QueryOne(ForJob("kiln_training_target_epochs")), kEpochs);
  EXPECT_EQ(QueryOne(ForJob("kiln_training_samples_total")), kEpochs * kTrainSamples);
  EXPECT_EQ(QueryOne(ForJob("kiln_training_step_duration_seconds_count")), kSteps);
  EXPECT_GT(QueryOne(ForJob("kiln_training_samples_per_second")), 0);
  EXPECT_GT(last_sps, 0);
  EXPECT_NEAR(QueryOne(ForJob("kiln_training_learning_rate")), 0.05, 1e-6);
  EXPECT_GE(QueryOne(absl::StrCat("sum(kiln_checkpoints_total{job_id=\"", w_->job_id, "\"})")), 1);
  EXPECT_GT(QueryOne(ForJob("kiln_checkpoint_bytes")), 0);
  EXPECT_EQ(QueryOne("kiln_jobs{state=\"succeeded\"}"), 2);  // with the job of two workers
  EXPECT_EQ(QueryOne("kiln_jobs{state=\"running\"}"), 0);
  EXPECT_EQ(QueryOne("kiln_job_submissions_total"), 2);
  EXPECT_EQ(QueryOne("kiln_grpc_requests_total{method=\"/kiln.v1.Training/SubmitJob\","
                     "code=\"OK\"}"),
            2);
  EXPECT_EQ(QueryOne("kiln_grpc_requests_total{method=\"/kiln.v1.Training/GetJob\","
                     "code=\"NOT_FOUND\"}"),
            1);
  EXPECT_GT(QueryOne("kiln_device_memory_used_bytes{device=\"cpu\"}"), 0);
  EXPECT_EQ(QueryOne("kiln_build_info"), 1);
  // The deployed model, idle now: its queue is there, and empty.
  EXPECT_EQ(QueryOne("kiln_inference_queue_depth{model=\"toy\",version=\"1\"}"), 0);
}

TEST_F(PrometheusIntegrationTest, AJobOfTwoWorkersHasSeriesPerRankAndForItsAllreduce) {
  const std::string job = absl::StrCat("job_id=\"", w_->workers_job_id, "\"");
  EXPECT_EQ(QueryOne(absl::StrCat("kiln_job_workers{", job, "}")), 2);
  EXPECT_EQ(QueryOne(absl::StrCat("count(kiln_worker_samples_per_second{", job, "})")), 2);
  EXPECT_GT(QueryOne(absl::StrCat("min(kiln_worker_samples_per_second{", job, "})")), 0);
  // Every rank's allreduce of every step.
  const int steps = kWorkerEpochs * (kTrainSamples / kBatch);
  EXPECT_EQ(QueryOne(absl::StrCat("kiln_allreduce_duration_seconds_count{", job, "}")), 2 * steps);
  EXPECT_GT(QueryOne(absl::StrCat("kiln_allreduce_bytes_total{", job, "}")), 0);
  EXPECT_EQ(QueryOne(absl::StrCat("kiln_training_step{", job, "}")), steps);
}

// Scraped without honor_labels, as deploy/prometheus/prometheus.yml does: the per-job series
// keep the kiln job id in job_id, and `job` is the scrape job's, as on every other series.
TEST_F(PrometheusIntegrationTest, PerJobSeriesCarryJobIdBesideTheScrapeJob) {
  EXPECT_EQ(QueryOne(absl::StrCat("kiln_training_step{job=\"kilnd\",job_id=\"", w_->job_id, "\"}")),
            kSteps);
  EXPECT_EQ(QueryOne("count({exported_job!=\"\"}) or vector(0)"), 0)
      << "a `job` label of kilnd's own was renamed to exported_job";
}

TEST_F(PrometheusIntegrationTest, ProcessMetricsDescribeKilnd) {
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  const double started = QueryOne("process_start_time_seconds{job=\"kilnd\"}");
  EXPECT_LE(started, now);
  EXPECT_GT(started, now - 600) << "kilnd started with this suite";
  EXPECT_GT(QueryOne("process_cpu_seconds_total{job=\"kilnd\"}"), 0);  // it trained a job
  EXPECT_GT(QueryOne("process_resident_memory_bytes{job=\"kilnd\"}"), 1 << 20);
  EXPECT_GT(QueryOne("process_virtual_memory_bytes{job=\"kilnd\"}"), 1 << 20);
  const double open = QueryOne("process_open_fds{job=\"kilnd\"}");
  EXPECT_GE(open, 3);
  EXPECT_GT(QueryOne("process_max_fds{job=\"kilnd\"}"), open);
}

TEST_F(PrometheusIntegrationTest, TheScrapePassesPromtoolCheckMetrics) {
  const std::string promtool = testing::FindProgram("promtool");
  if (promtool.empty()) GTEST_SKIP() << "promtool is not installed";
  absl::StatusOr<std::string> scrape =
      testing::HttpGet(absl::StrCat("http://127.0.0.1:", w_->kilnd->metrics_port(), "/metrics"));
  ASSERT_OK(scrape) << scrape.status();
  EXPECT_THAT(*scrape, HasSubstr("kiln_training_loss{job_id=\"" + w_->job_id));
  const std::string path = w_->root + "/scrape.txt";
  std::ofstream(path) << *scrape;
  const testing::ProgramResult result = testing::RunProgram({promtool, "check", "metrics"}, path);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output, "") << "promtool lint findings";
}

TEST_F(PrometheusIntegrationTest, EveryDashboardQueryReturnsData) {
  const std::vector<std::string> exprs = DashboardExprs();
  ASSERT_GE(exprs.size(), 15u);
  // Serving may not feed its series yet; then its panels may be empty, but must still parse.
  const bool serving_wired =
      !Values(*w_->prometheus->Query("kiln_inference_requests_total")).empty();
  int empty_serving = 0;
  for (const std::string& raw : exprs) {
    const std::string expr = ExpandGrafanaVariables(raw);
    SCOPED_TRACE(expr);
    EXPECT_FALSE(absl::StrContains(expr, "$")) << "an unexpanded Grafana variable";
    absl::StatusOr<nlohmann::json> data = w_->prometheus->Query(expr);
    ASSERT_OK(data) << data.status();
    const std::vector<double> values = Values(*data);
    if (!serving_wired && absl::StrContains(expr, "kiln_inference_")) {
      ++empty_serving;
      continue;
    }
    EXPECT_TRUE(AnyFinite(values)) << "no finite value in " << data->dump();
  }
  if (!serving_wired) {
    std::printf(
        "note: serving exports no kiln_inference_* series yet; %d serving queries were "
        "only parsed (ServingPanelsReturnDataForRecordedInference covers them)\n",
        empty_serving);
  }
}

TEST_F(PrometheusIntegrationTest, TheEventLogHasOneJsonLinePerEvent) {
  std::vector<nlohmann::json> lines;
  for (absl::string_view line : absl::StrSplit(w_->kilnd->Stderr(), '\n', absl::SkipEmpty())) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(j.is_discarded()) << "not JSON: " << line;
    lines.push_back(j);
  }
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0]["event"], "server_started");
  EXPECT_EQ(lines[0]["grpc"], absl::StrCat("127.0.0.1:", w_->kilnd->port()));
  EXPECT_EQ(lines[0]["metrics"], absl::StrCat("127.0.0.1:", w_->kilnd->metrics_port()));
  EXPECT_EQ(lines[0]["device"], "cpu");
  std::vector<std::string> job_events;
  for (const nlohmann::json& j : lines) {
    if (j.value("job", "") == w_->job_id) job_events.push_back(j["event"]);
  }
  std::vector<std::string> expected = {"job_submitted", "job_started"};
  for (int e = 0; e < kEpochs; ++e) expected.push_back("epoch_done");
  expected.push_back("checkpoint_written");  // the final one; SmallSpec asks for no others
  expected.push_back("job_finished");
  EXPECT_EQ(job_events, expected);
}

TEST(PrometheusConfigTest, TheDeployConfigPassesPromtoolCheckConfig) {
  const std::string promtool = testing::FindProgram("promtool");
  if (promtool.empty()) GTEST_SKIP() << "promtool is not installed (Debian's prometheus has it)";
  const testing::ProgramResult result = testing::RunProgram(
      {promtool, "check", "config", SourcePath("deploy/prometheus/prometheus.yml")}, "");
  EXPECT_EQ(result.exit_code, 0) << result.output;
}

// The serving panels against metrics shaped as the serving path records them (RecordInference),
// so their queries are known to return data before serving itself feeds them.
TEST(PrometheusServingPanelsTest, ServingPanelsReturnDataForRecordedInference) {
  SKIP_WITHOUT_PROMETHEUS();
  const std::string root = testing::MakeTempDir("kiln-prometheus-serving");
  Metrics metrics;
  ASSERT_OK(metrics.Serve("127.0.0.1:0"));
  metrics.SetInferenceQueueSource([] {
    return std::vector<InferenceQueueDepth>{{"mnist-mlp", "1", 2}};
  });
  testing::PrometheusProcess prometheus(
      PrometheusBinary(), root + "/prometheus",
      std::vector<std::string>{absl::StrCat("127.0.0.1:", metrics.port())});
  ASSERT_TRUE(prometheus.Start(absl::Seconds(60))) << prometheus.log();
  // Before any request: the error panels show 0, not "no data".
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        absl::StatusOr<nlohmann::json> up = prometheus.Query("up{job=\"kilnd\"}");
        absl::SleepFor(absl::Milliseconds(200));
        return up.ok() && Values(*up) == std::vector<double>{1};
      },
      absl::Seconds(60)))
      << prometheus.log();
  const std::vector<std::string> error_exprs = ErrorPanelExprs();
  EXPECT_GE(error_exprs.size(), 2u);
  for (const std::string& raw : error_exprs) {
    const std::string expr = ExpandGrafanaVariables(raw);
    SCOPED_TRACE(expr);
    absl::StatusOr<nlohmann::json> data = prometheus.Query(expr);
    ASSERT_OK(data) << data.status();
    EXPECT_EQ(Values(*data), std::vector<double>{0}) << data->dump();
  }
  std::atomic<bool> stop{false};
  std::thread traffic([&] {
    for (int i = 0; !stop; ++i) {
      metrics.RecordInference(
          "mnist-mlp", "1",
          i % 10 == 0 ? absl::StatusCode::kInvalidArgument : absl::StatusCode::kOk,
          0.002 + 0.0001 * (i % 7), 0.0005, 1 + i % 8);
      absl::SleepFor(absl::Milliseconds(5));
    }
  });
  // Enough scrapes for rate() over the recorded traffic.
  const bool scraped = testing::WaitFor(
      [&] {
        absl::StatusOr<nlohmann::json> d =
            prometheus.Query("count_over_time(kiln_inference_requests_total{code=\"OK\"}[1m])");
        absl::SleepFor(absl::Milliseconds(200));
        return d.ok() && !Values(*d).empty() && Values(*d)[0] >= 4;
      },
      absl::Seconds(60));
  ASSERT_TRUE(scraped) << prometheus.log();
  int serving = 0;
  for (const std::string& raw : DashboardExprs()) {
    if (!absl::StrContains(raw, "kiln_inference_")) continue;
    ++serving;
    const std::string expr = ExpandGrafanaVariables(raw);
    SCOPED_TRACE(expr);
    absl::StatusOr<nlohmann::json> data = prometheus.Query(expr);
    ASSERT_OK(data) << data.status();
    EXPECT_TRUE(AnyFinite(Values(*data))) << "no finite value in " << data->dump();
  }
  EXPECT_GE(serving, 4);
  stop = true;
  traffic.join();
  std::error_code ec;
  fs::remove_all(root, ec);
}

}  // namespace
}  // namespace kiln::server
