// kiln's metric families: names, labels, job-state accounting, retention of job series, the
// inference API and queue depths, gRPC call counting, the process_* families, and the /metrics
// endpoint, in process.
#include "server/observability/metrics.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <future>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/trainer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inference/grpc_service.grpc.pb.h"
#include "prometheus_harness.h"
#include "server/daemon.h"
#include "server_test_support.h"
#include "tests/support/connected_channel.h"
#include "tests/support/status_matchers.h"

namespace kiln::server {
namespace {
namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

StepEvent Step(int epoch, int step_in_epoch, int steps_per_epoch, float loss) {
  StepEvent e;
  e.epoch = epoch;
  e.step_in_epoch = step_in_epoch;
  e.steps_per_epoch = steps_per_epoch;
  e.global_step = (epoch - 1) * steps_per_epoch + step_in_epoch;
  e.loss = loss;
  e.lr = 0.05f;
  e.samples_per_sec = 1000;
  return e;
}

// The value of `series` (name and labels exactly as scraped) in a scrape; NAN when absent.
double ScrapedValue(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, series + " ")) continue;
    double value = NAN;
    return absl::SimpleAtod(line, &value) ? value : NAN;
  }
  return NAN;
}

TEST(MetricsTest, ScrapeDeclaresEveryFamilyWithItsType) {
  Metrics metrics;
  const std::string text = metrics.Scrape();
  for (const char* line : {
           "# TYPE kiln_build_info gauge",
           "# TYPE kiln_jobs gauge",
           "# TYPE kiln_job_submissions_total counter",
           "# TYPE kiln_job_completions_total counter",
           "# TYPE kiln_device_memory_used_bytes gauge",
           "# TYPE kiln_device_memory_total_bytes gauge",
           "# TYPE kiln_inference_queue_depth gauge",
           "# TYPE process_cpu_seconds_total counter",
           "# TYPE process_resident_memory_bytes gauge",
           "# TYPE process_virtual_memory_bytes gauge",
           "# TYPE process_start_time_seconds gauge",
           "# TYPE process_open_fds gauge",
           "# TYPE process_max_fds gauge",
       }) {
    EXPECT_THAT(text, HasSubstr(line));
  }
  EXPECT_THAT(text, HasSubstr("kiln_build_info{cuda=\""));
  EXPECT_THAT(text, HasSubstr("kiln_jobs{state=\"queued\"} 0"));
  EXPECT_THAT(text, HasSubstr("kiln_job_completions_total{state=\"failed\"} 0"));
  EXPECT_THAT(text, HasSubstr("kiln_device_memory_used_bytes{device=\"cpu\"}"));
}

TEST(MetricsTest, CpuMemoryReportsThisProcessAndTheMachine) {
  const DeviceMemory m = CpuMemory();
  EXPECT_EQ(m.device, "cpu");
  EXPECT_GT(m.used_bytes, 0);
  EXPECT_GT(m.total_bytes, m.used_bytes);
}

TEST(MetricsTest, ProcessStatsDescribeThisProcess) {
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  // Some CPU time to count.
  volatile double sink = 0;
  for (int i = 0; i < 20000000; ++i) sink = sink + i * 0.5;
  const ProcessStats p = ReadProcessStats();
  EXPECT_GT(p.cpu_seconds, 0);
  EXPECT_GT(p.resident_bytes, 1 << 20);
  EXPECT_GT(p.virtual_bytes, p.resident_bytes);
  // This test process started moments ago (a whole suite takes minutes, not an hour).
  EXPECT_LE(p.start_time_seconds, now + 1);
  EXPECT_GT(p.start_time_seconds, now - 3600);
  EXPECT_GE(p.open_fds, 3);  // stdin, stdout, stderr at least
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  EXPECT_EQ(p.max_fds, static_cast<int64_t>(limit.rlim_cur));
  EXPECT_GE(p.max_fds, p.open_fds);
}

TEST(MetricsTest, ProcessFamiliesAreReadAtEachScrape) {
  Metrics metrics;
  const std::string before = metrics.Scrape();
  const double fds = ScrapedValue(before, "process_open_fds");
  const double cpu = ScrapedValue(before, "process_cpu_seconds_total");
  ASSERT_FALSE(std::isnan(fds)) << before;
  ASSERT_FALSE(std::isnan(cpu)) << before;
  EXPECT_GT(ScrapedValue(before, "process_resident_memory_bytes"), 0);
  EXPECT_GT(ScrapedValue(before, "process_virtual_memory_bytes"), 0);
  EXPECT_GT(ScrapedValue(before, "process_max_fds"), 0);
  EXPECT_NEAR(ScrapedValue(before, "process_start_time_seconds"),
              ReadProcessStats().start_time_seconds, 0.02);

  std::vector<int> opened;
  for (int i = 0; i < 5; ++i) opened.push_back(open("/dev/null", O_RDONLY | O_CLOEXEC));
  for (int fd : opened) ASSERT_GE(fd, 0);
  volatile double sink = 0;
  const absl::Time spin_until = absl::Now() + absl::Milliseconds(50);
  while (absl::Now() < spin_until) sink = sink + 1;
  const std::string during = metrics.Scrape();
  EXPECT_EQ(ScrapedValue(during, "process_open_fds"), fds + 5);
  EXPECT_GT(ScrapedValue(during, "process_cpu_seconds_total"), cpu);
  for (int fd : opened) close(fd);
  EXPECT_EQ(ScrapedValue(metrics.Scrape(), "process_open_fds"), fds);
}

TEST(MetricsTest, QueueDepthsAreReadFromTheSourceAtEachScrape) {
  Metrics metrics;
  EXPECT_THAT(metrics.Scrape(), Not(HasSubstr("kiln_inference_queue_depth{")));
  std::vector<InferenceQueueDepth> depths = {{"digits", "1", 3}, {"digits", "2", 0}};
  metrics.SetInferenceQueueSource([&] { return depths; });
  std::string text = metrics.Scrape();
  EXPECT_THAT(text, HasSubstr("kiln_inference_queue_depth{model=\"digits\",version=\"1\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("kiln_inference_queue_depth{model=\"digits\",version=\"2\"} 0\n"));
  // Version 1 unloaded: its series goes with it, with nothing to forget.
  depths = {{"digits", "2", 7}};
  text = metrics.Scrape();
  EXPECT_THAT(text, Not(HasSubstr("version=\"1\"")));
  EXPECT_THAT(text, HasSubstr("kiln_inference_queue_depth{model=\"digits\",version=\"2\"} 7\n"));
  metrics.SetInferenceQueueSource(nullptr);
  EXPECT_THAT(metrics.Scrape(), Not(HasSubstr("kiln_inference_queue_depth{")));
}

TEST(MetricsTest, JobStatesMoveBetweenGaugesAndFinalStatesCountCompletions) {
  Metrics metrics;
  metrics.JobSubmitted();
  metrics.JobStateChanged("a", v1::JOB_STATE_UNSPECIFIED, v1::JOB_STATE_QUEUED);
  metrics.JobStateChanged("a", v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING);
  metrics.JobStateChanged("b", v1::JOB_STATE_UNSPECIFIED, v1::JOB_STATE_QUEUED);
  // A job loaded from the store already finished is not a new completion.
  metrics.JobStateChanged("c", v1::JOB_STATE_UNSPECIFIED, v1::JOB_STATE_SUCCEEDED);
  metrics.JobStateChanged("a", v1::JOB_STATE_RUNNING, v1::JOB_STATE_FAILED);
  const std::string text = metrics.Scrape();
  EXPECT_THAT(text, HasSubstr("kiln_jobs{state=\"queued\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("kiln_jobs{state=\"running\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("kiln_jobs{state=\"failed\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("kiln_jobs{state=\"succeeded\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("kiln_job_completions_total{state=\"failed\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("kiln_job_completions_total{state=\"succeeded\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("kiln_job_submissions_total 1\n"));
}

TEST(MetricsTest, TrainingSeriesCarryJobAndModelLabels) {
  Metrics metrics;
  metrics.TrainingStarted("job-1", "mnist-mlp", 4);
  metrics.TrainingStep("job-1", Step(1, 2, 4, 0.5f), 32, 0.002);
  EpochEvent epoch;
  epoch.epoch = 1;
  epoch.train_accuracy = 0.75;
  epoch.test.accuracy = 0.875;
  epoch.test.loss = 0.25;
  epoch.test.samples = 64;
  metrics.TrainingEpoch("job-1", epoch);
  metrics.CheckpointWritten("job-1", "periodic", 0.01, 12345);
  const std::string text = metrics.Scrape();
  const std::string labels = "{job_id=\"job-1\",model=\"mnist-mlp\"}";
  EXPECT_THAT(text, HasSubstr("kiln_training_loss" + labels + " 0.5\n"));
  EXPECT_THAT(text, HasSubstr("kiln_training_test_accuracy" + labels + " 0.875\n"));
  EXPECT_THAT(text, HasSubstr("kiln_training_test_loss" + labels + " 0.25\n"));
  EXPECT_THAT(text, HasSubstr("kiln_training_epoch" + labels + " 1\n"));
  EXPECT_THAT(text, HasSubstr("kiln_training_target_epochs" + labels + " 4\n"));
  EXPECT_THAT(text, HasSubstr("kiln_training_step" + labels + " 2\n"));
  EXPECT_THAT(text, HasSubstr("kiln_training_samples_total" + labels + " 32\n"));
  EXPECT_THAT(text, HasSubstr("kiln_training_samples_per_second" + labels + " 1000\n"));
  EXPECT_THAT(text, HasSubstr("kiln_training_step_duration_seconds_count" + labels + " 1\n"));
  EXPECT_THAT(text, HasSubstr("kiln_training_learning_rate" + labels));
  EXPECT_THAT(text, HasSubstr("kiln_checkpoints_total{job_id=\"job-1\",kind=\"periodic\","
                              "model=\"mnist-mlp\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("kiln_checkpoint_bytes" + labels + " 12345\n"));
  EXPECT_THAT(text, HasSubstr("kiln_checkpoint_write_duration_seconds_count" + labels + " 1\n"));
}

TEST(MetricsTest, EventsOfUnknownJobsAreIgnored) {
  Metrics metrics;
  metrics.TrainingStep("nobody", Step(1, 1, 1, 1.0f), 1, 0.1);
  metrics.CheckpointWritten("nobody", "final", 0.1, 1);
  EXPECT_THAT(metrics.Scrape(), Not(HasSubstr("nobody")));
}

TEST(MetricsTest, FinishedJobSeriesAreRemovedAfterTheRetention) {
  MetricsOptions options;
  options.job_retention = absl::Milliseconds(200);
  Metrics metrics(options);
  metrics.TrainingStarted("old", "custom", 1);
  metrics.TrainingStep("old", Step(1, 1, 1, 1.0f), 8, 0.001);
  metrics.TrainingStarted("live", "custom", 1);
  metrics.TrainingStep("live", Step(1, 1, 1, 1.0f), 8, 0.001);
  metrics.JobStateChanged("old", v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED);
  EXPECT_THAT(metrics.Scrape(), HasSubstr("job_id=\"old\""));  // still within the retention
  EXPECT_TRUE(testing::WaitFor(
      [&] { return !absl::StrContains(metrics.Scrape(), "job_id=\"old\""); }, absl::Seconds(5)));
  EXPECT_THAT(metrics.Scrape(), HasSubstr("kiln_training_loss{job_id=\"live\""));
}

TEST(MetricsTest, EndedJobsBeyondTheCapLoseTheirSeriesFirstEndedFirst) {
  MetricsOptions options;
  options.job_retention = absl::Hours(1);  // only the cap reaps here
  options.max_ended_jobs = 3;
  Metrics metrics(options);
  for (int i = 0; i < 6; ++i) {
    const std::string job = absl::StrCat("j", i);
    metrics.TrainingStarted(job, "custom", 1);
    metrics.JobStateChanged(job, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED);
    absl::SleepFor(absl::Milliseconds(2));  // distinct end times
  }
  metrics.TrainingStarted("running", "custom", 1);
  metrics.ReapExpiredJobs();
  const std::string text = metrics.Scrape();
  for (const char* gone : {"j0", "j1", "j2"}) {
    EXPECT_THAT(text, Not(HasSubstr(absl::StrCat("job_id=\"", gone, "\"")))) << gone;
  }
  for (const char* kept : {"j3", "j4", "j5", "running"}) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat("job_id=\"", kept, "\""))) << kept;
  }
}

TEST(MetricsTest, AResumedJobKeepsItsSeries) {
  MetricsOptions options;
  options.job_retention = absl::Milliseconds(100);
  Metrics metrics(options);
  metrics.TrainingStarted("j", "custom", 1);
  metrics.JobStateChanged("j", v1::JOB_STATE_RUNNING, v1::JOB_STATE_CANCELLED);
  metrics.TrainingStarted("j", "custom", 2);  // resumed before the series expired
  absl::SleepFor(absl::Milliseconds(400));
  metrics.ReapExpiredJobs();
  EXPECT_THAT(metrics.Scrape(),
              HasSubstr("kiln_training_target_epochs{job_id=\"j\",model=\"custom\"} 2"));
}

TEST(MetricsTest, InferenceRequestsAreRecordedByModelVersionAndCode) {
  Metrics metrics;
  metrics.RecordInference("mnist", "1", absl::StatusCode::kOk, 0.004, 0.001, 8);
  metrics.RecordInference("mnist", "1", absl::StatusCode::kOk, 0.006, 0.002, 8);
  metrics.RecordInference("mnist", "1", absl::StatusCode::kInvalidArgument, 0.0001, 0, 0);
  std::string text = metrics.Scrape();
  EXPECT_THAT(text, HasSubstr("kiln_inference_requests_total{code=\"OK\",model=\"mnist\","
                              "version=\"1\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("kiln_inference_requests_total{code=\"INVALID_ARGUMENT\","
                              "model=\"mnist\",version=\"1\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("kiln_inference_request_duration_seconds_count{model=\"mnist\"} 3"));
  // A request that never ran in a batch has no queue time or batch size.
  EXPECT_THAT(text, HasSubstr("kiln_inference_queue_duration_seconds_count{model=\"mnist\"} 2"));
  EXPECT_THAT(text, HasSubstr("kiln_inference_batch_size_sum{model=\"mnist\"} 16"));
  metrics.ForgetInferenceModel("mnist");
  EXPECT_THAT(metrics.Scrape(), Not(HasSubstr("model=\"mnist\"")));
}

TEST(MetricsTest, InferenceStatsAreReadBackFromTheFamiliesPrometheusScrapes) {
  Metrics metrics;
  EXPECT_TRUE(metrics.InferenceStats().empty());
  // Nine fast requests (in the 0.5-1 ms bucket) and one slow (in 5-10 ms), one of them refused.
  for (int i = 0; i < 9; ++i) {
    metrics.RecordInference("mnist", "1", absl::StatusCode::kOk, 0.0008, 0.0001, 4);
  }
  metrics.RecordInference("mnist", "2", absl::StatusCode::kInvalidArgument, 0.008, 0, 0);
  metrics.RecordInference("fashion", "1", absl::StatusCode::kOk, 0.02, 0.001, 1);
  const std::vector<InferenceModelStats> stats = metrics.InferenceStats();
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_EQ(stats[0].model, "fashion");
  EXPECT_EQ(stats[0].requests, 1);
  const InferenceModelStats& mnist = stats[1];
  EXPECT_EQ(mnist.model, "mnist");
  EXPECT_EQ(mnist.requests, 10);  // both versions
  EXPECT_EQ(mnist.failed_requests, 1);
  EXPECT_GT(mnist.p50_seconds, 0.0005);
  EXPECT_LE(mnist.p50_seconds, 0.001);
  EXPECT_GT(mnist.p99_seconds, 0.005);
  EXPECT_LE(mnist.p99_seconds, 0.01);
  // The scrape shows the same count.
  EXPECT_THAT(metrics.Scrape(),
              HasSubstr("kiln_inference_request_duration_seconds_count{model=\"mnist\"} 10"));
}

TEST(MetricsTest, BucketQuantileInterpolatesAsHistogramQuantile) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(BucketQuantile(0.5, {}), 0);
  EXPECT_EQ(BucketQuantile(0.5, {{1, 0}, {inf, 0}}), 0);
  // 10 observations in (1, 2]: the median is halfway through that bucket.
  EXPECT_DOUBLE_EQ(BucketQuantile(0.5, {{1, 0}, {2, 10}, {inf, 10}}), 1.5);
  // In the first bucket, the lower bound is 0.
  EXPECT_DOUBLE_EQ(BucketQuantile(0.5, {{4, 10}, {inf, 10}}), 2);
  // Past the last finite bound, that bound is all that is known.
  EXPECT_DOUBLE_EQ(BucketQuantile(0.99, {{1, 5}, {2, 5}, {inf, 10}}), 2);
}

TEST(MetricsTest, GrpcMethodsBeyondTheCapFoldIntoOther) {
  Metrics metrics;
  for (int i = 0; i < 300; ++i) metrics.RecordGrpc(absl::StrCat("/x.Y/M", i), 12, 0.001);
  const std::string text = metrics.Scrape();
  EXPECT_THAT(text,
              HasSubstr("kiln_grpc_requests_total{code=\"UNIMPLEMENTED\",method=\"/x.Y/M0\"} 1"));
  EXPECT_THAT(text,
              HasSubstr("kiln_grpc_requests_total{code=\"UNIMPLEMENTED\",method=\"other\"} 100"));
}

TEST(MetricsTest, ServesTheTextFormatOverHttp) {
  Metrics metrics;
  ASSERT_OK(metrics.Serve("127.0.0.1:0"));
  ASSERT_GT(metrics.port(), 0);
  absl::StatusOr<std::string> body =
      testing::HttpGet(absl::StrCat("http://127.0.0.1:", metrics.port(), "/metrics"));
  ASSERT_OK(body) << body.status();
  EXPECT_THAT(*body, HasSubstr("kiln_build_info{"));
  EXPECT_THAT(*body, HasSubstr("kiln_device_memory_total_bytes{device=\"cpu\"}"));
}

// One client trickling its request (a byte every half second) holds no one else up, and is
// dropped once it stalls: each read must progress within 5 s (httplib's read timeout; it is
// answered 400 first). Unlike the hand-written server this replaced, the whole request has no
// deadline of its own: a trickle holds one of the listener's threads while it lasts.
TEST(MetricsTest, ASlowClientDoesNotBlockScrapesAndIsDropped) {
  Metrics metrics;
  ASSERT_OK(metrics.Serve("127.0.0.1:0"));
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(metrics.port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::atomic<bool> dropped{false};
  std::thread slow([&] {
    const std::string request = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: ";
    for (int i = 0; i < 10 && !dropped; ++i) {  // 5 s of trickle, then it stalls
      if (send(fd, &request[i % request.size()], 1, MSG_NOSIGNAL) != 1) dropped = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  });
  // A scrape while the slow client trickles: answered (HttpGet gives up after 10 s).
  absl::StatusOr<std::string> body =
      testing::HttpGet(absl::StrCat("http://127.0.0.1:", metrics.port(), "/metrics"));
  EXPECT_OK(body) << body.status();
  if (body.ok()) {
    EXPECT_THAT(*body, HasSubstr("kiln_build_info{"));
  }
  // The slow client is closed on: reads see at most a 400, then the end of the stream.
  char buf[4096];
  timeval wait{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
  std::string answer;
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) answer.append(buf, static_cast<size_t>(n));
  EXPECT_EQ(n, 0) << "the slow client was not dropped";
  if (!answer.empty()) {
    EXPECT_THAT(answer, ::testing::StartsWith("HTTP/1.1 400"));
  }
  dropped = true;
  slow.join();
  close(fd);
}

TEST(MetricsTest, ABusyAddressIsUnavailable) {
  Metrics first;
  ASSERT_OK(first.Serve("127.0.0.1:0"));
  Metrics second;
  const absl::Status status = second.Serve(absl::StrCat("127.0.0.1:", first.port()));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("--metrics_listen"));
}

// The job manager's and the gRPC edge's hooks, through an in-process daemon.
TEST(MetricsTest, ADaemonReportsItsJobsTrainingAndGrpcCalls) {
  const std::string root = testing::MakeTempDir("kilnd-metrics");
  DaemonOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "127.0.0.1:0";
  options.state_dir = root + "/state";
  options.data_dir = root + "/data";
  options.device = "cpu";
  options.log_stream = nullptr;
  testing::WriteToyDataset(options.data_dir + "/toy", 128, 32);
  auto daemon = Daemon::Start(options);
  ASSERT_OK(daemon) << daemon.status();
  ASSERT_GT((*daemon)->metrics_port(), 0);
  auto stub = v1::Training::NewStub(
      kiln::testing::ConnectedChannel(absl::StrCat("127.0.0.1:", (*daemon)->port())));
  grpc::ClientContext context;
  v1::SubmitJobRequest request;
  *request.mutable_spec() = testing::SmallSpec("toy", 2);
  v1::Job job;
  ASSERT_OK(stub->SubmitJob(&context, request, &job));
  ASSERT_TRUE(testing::WaitForState(*stub, job.id(), v1::JOB_STATE_SUCCEEDED, absl::Seconds(60)));

  const std::string text = (*daemon)->metrics().Scrape();
  const std::string labels = absl::StrCat("{job_id=\"", job.id(), "\",model=\"custom\"}");
  EXPECT_THAT(text, HasSubstr("kiln_jobs{state=\"succeeded\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("kiln_job_completions_total{state=\"succeeded\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("kiln_job_submissions_total 1\n"));
  EXPECT_THAT(text, HasSubstr("kiln_training_step" + labels + " 8\n"));  // 2 epochs of 4 steps
  EXPECT_THAT(text, HasSubstr("kiln_training_samples_total" + labels + " 256\n"));
  EXPECT_THAT(text, HasSubstr("kiln_training_step_duration_seconds_count" + labels + " 8\n"));
  EXPECT_THAT(text, HasSubstr("kiln_training_epoch" + labels + " 2\n"));
  EXPECT_THAT(text, HasSubstr("kiln_training_test_accuracy" + labels));
  EXPECT_THAT(text, HasSubstr("kiln_checkpoints_total{job_id=\"" + job.id()));
  EXPECT_THAT(text, HasSubstr("kiln_grpc_requests_total{code=\"OK\","
                              "method=\"/kiln.v1.Training/SubmitJob\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("kiln_grpc_requests_total{code=\"OK\","
                              "method=\"/kiln.v1.Training/GetJob\"}"));
  daemon->reset();
  std::error_code ec;
  fs::remove_all(root, ec);
}

// The daemon reads each loaded version's batcher queue at scrape time: a series per version
// while it is loaded, none once it is unloaded.
TEST(MetricsTest, ADaemonReportsTheQueueOfEachLoadedVersion) {
  const std::string root = testing::MakeTempDir("kilnd-metrics");
  DaemonOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "";
  options.state_dir = root + "/state";
  options.data_dir = root + "/data";
  options.device = "cpu";
  options.log_stream = nullptr;
  testing::WriteToyDataset(options.data_dir + "/toy", 128, 32);
  auto daemon = Daemon::Start(options);
  ASSERT_OK(daemon) << daemon.status();
  auto channel = kiln::testing::ConnectedChannel(absl::StrCat("127.0.0.1:", (*daemon)->port()));
  auto stub = v1::Training::NewStub(channel);
  grpc::ClientContext context;
  v1::SubmitJobRequest request;
  *request.mutable_spec() = testing::SmallSpec("toy", 1);
  v1::Job job;
  ASSERT_OK(stub->SubmitJob(&context, request, &job));
  ASSERT_TRUE(testing::WaitForState(*stub, job.id(), v1::JOB_STATE_SUCCEEDED, absl::Seconds(60)));
  EXPECT_THAT((*daemon)->metrics().Scrape(), Not(HasSubstr("kiln_inference_queue_depth{")));

  auto inference = inference::GRPCInferenceService::NewStub(channel);
  {
    grpc::ClientContext load_context;
    inference::RepositoryModelLoadRequest load;
    load.set_model_name("toy");
    (*load.mutable_parameters())["checkpoint"].set_string_param(job.id() + "@latest");
    inference::RepositoryModelLoadResponse loaded;
    ASSERT_OK(inference->RepositoryModelLoad(&load_context, load, &loaded));
  }
  EXPECT_THAT((*daemon)->metrics().Scrape(),
              HasSubstr("kiln_inference_queue_depth{model=\"toy\",version=\"1\"} 0\n"));
  {
    grpc::ClientContext unload_context;
    inference::RepositoryModelUnloadRequest unload;
    unload.set_model_name("toy");
    inference::RepositoryModelUnloadResponse unloaded;
    ASSERT_OK(inference->RepositoryModelUnload(&unload_context, unload, &unloaded));
  }
  EXPECT_THAT((*daemon)->metrics().Scrape(), Not(HasSubstr("kiln_inference_queue_depth{")));
  daemon->reset();
  std::error_code ec;
  fs::remove_all(root, ec);
}

// Names a client makes up never become labels: methods no service has and models that are not
// loaded are counted under "unknown" (5,000 random versions once took /metrics to 85 MB).
TEST(MetricsTest, ClientChosenNamesOfUnknownMethodsAndModelsFoldIntoUnknown) {
  const std::string root = testing::MakeTempDir("kilnd-metrics");
  DaemonOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "";
  options.state_dir = root + "/state";
  options.data_dir = root + "/data";
  options.device = "cpu";
  options.log_stream = nullptr;
  auto daemon = Daemon::Start(options);
  ASSERT_OK(daemon) << daemon.status();
  auto channel = kiln::testing::ConnectedChannel(absl::StrCat("127.0.0.1:", (*daemon)->port()));
  grpc::GenericStub generic(channel);
  for (const char* method : {"/kiln.v1.Training/NoSuchMethod", "/made.Up/Random123"}) {
    grpc::Slice slice(std::string(""));
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::ClientContext context;
    std::promise<grpc::Status> done;
    generic.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                      [&](grpc::Status s) { done.set_value(s); });
    EXPECT_EQ(done.get_future().get().error_code(), grpc::StatusCode::UNIMPLEMENTED) << method;
  }
  auto inference = inference::GRPCInferenceService::NewStub(channel);
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext context;
    inference::ModelInferRequest request;
    request.set_model_name(absl::StrCat("nope-", i));
    request.set_model_version(absl::StrCat("v-random-", i));
    inference::ModelInferResponse response;
    EXPECT_FALSE(inference->ModelInfer(&context, request, &response).ok());
  }
  const std::string text = (*daemon)->metrics().Scrape();
  EXPECT_THAT(text, HasSubstr("kiln_grpc_requests_total{code=\"UNIMPLEMENTED\","
                              "method=\"unknown\"} 2\n"));
  EXPECT_THAT(text, Not(HasSubstr("NoSuchMethod")));
  EXPECT_THAT(text, Not(HasSubstr("Random123")));
  EXPECT_THAT(text, HasSubstr("model=\"unknown\",version=\"unknown\"} 3\n"));
  EXPECT_THAT(text, Not(HasSubstr("v-random")));
  EXPECT_THAT(text, Not(HasSubstr("nope-")));
  daemon->reset();
  std::error_code ec;
  fs::remove_all(root, ec);
}

}  // namespace
}  // namespace kiln::server
