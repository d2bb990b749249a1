// The structured event log: logfmt text and JSON lines, quoting, levels, and one line per event.
#include "server/observability/logging.h"

#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "engine/trainer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server_test_support.h"
#include "tests/support/kilnd_child.h"

namespace kiln::server {
namespace {
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

// Everything written to a temporary FILE, split into lines.
std::vector<std::string> Lines(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string text;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0) text.append(buffer, n);
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  return lines;
}

TEST(EventLogTest, ParsesTheFormatFlag) {
  EXPECT_EQ(*ParseLogFormat("text"), LogFormat::kText);
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  absl::StatusOr<LogFormat> bad = ParseLogFormat("xml");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("--log_format"));
}

TEST(EventLogTest, TextLinesAreLogfmtWithQuotedValuesWhereNeeded) {
  EventLog log(LogFormat::kText, nullptr);
  const std::string line = log.Format(LogLevel::kError, "job_failed",
                                      {{"job", "job-1"},
                                       {"reason", "loss became NaN at \"step\" 3"},
                                       {"step", 3},
                                       {"loss", 0.25},
                                       {"resumed", false},
                                       {"empty", ""}});
  EXPECT_THAT(line,
              MatchesRegex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}\\.[0-9]{3}Z error job_failed "
                           "job=job-1 reason=\"loss became NaN at \\\\\"step\\\\\" 3\" "
                           "step=3 loss=0.25 resumed=false empty=\"\""));
}

TEST(EventLogTest, JsonLinesKeepTheFieldsInOrder) {
  EventLog log(LogFormat::kJson, nullptr);
  const std::string line =
      log.Format(LogLevel::kInfo, "epoch_done", {{"job", "job-1"}, {"epoch", 2}, {"acc", 0.5}});
  const nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_EQ(j["level"], "info");
  EXPECT_EQ(j["event"], "epoch_done");
  EXPECT_EQ(j["job"], "job-1");
  EXPECT_EQ(j["epoch"], 2);
  EXPECT_EQ(j["acc"], 0.5);
  EXPECT_THAT(line, MatchesRegex("\\{\"ts\":\"[^\"]+\",\"level\":\"info\",\"event\":\"epoch_done\","
                                 "\"job\":\"job-1\",\"epoch\":2,\"acc\":0.5\\}"));
}

TEST(EventLogTest, EachEventIsOneLineWithTheJobId) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  EventLog log(LogFormat::kJson, f);
  v1::Job job;
  job.set_id("job-7");
  job.set_device("cpu");
  job.set_epochs(2);
  job.mutable_spec()->set_preset("mnist-mlp");
  job.mutable_spec()->set_dataset("mnist");
  log.JobSubmitted(job);
  job.set_state(v1::JOB_STATE_RUNNING);
  log.JobStateChanged(job, v1::JOB_STATE_QUEUED);
  EpochEvent epoch;
  epoch.epoch = 1;
  epoch.test.samples = 10;
  epoch.test.accuracy = 0.9;
  log.EpochDone("job-7", epoch, 2);
  v1::Checkpoint c;
  c.set_job_id("job-7");
  c.set_id(3);
  c.set_kind(v1::CHECKPOINT_KIND_BEST);
  log.CheckpointWritten(c, 0.01);
  job.set_state(v1::JOB_STATE_FAILED);
  job.set_reason("out of\nmemory");
  log.JobStateChanged(job, v1::JOB_STATE_RUNNING);
  log.ModelDeployed("mnist", "1", "job-7", 3);
  log.ServerStarted("127.0.0.1:7070", "127.0.0.1:9464", "auto", "cpu", "no NVIDIA driver");

  const std::vector<std::string> lines = Lines(f);
  std::fclose(f);
  ASSERT_EQ(lines.size(), 7u);
  std::vector<std::string> events;
  for (const std::string& line : lines) {
    const nlohmann::json j = nlohmann::json::parse(line);
    events.push_back(j["event"]);
    if (j["event"] != "server_started") {
      EXPECT_EQ(j["job"], "job-7") << line;
    }
  }
  EXPECT_THAT(events, ::testing::ElementsAre("job_submitted", "job_started", "epoch_done",
                                             "checkpoint_written", "job_failed", "model_deployed",
                                             "server_started"));
  const nlohmann::json failed = nlohmann::json::parse(lines[4]);
  EXPECT_EQ(failed["level"], "error");
  EXPECT_EQ(failed["reason"], "out of\nmemory");
  EXPECT_EQ(nlohmann::json::parse(lines[2])["test_accuracy"], 0.9);
  EXPECT_EQ(nlohmann::json::parse(lines[3])["kind"], "best");
  EXPECT_EQ(nlohmann::json::parse(lines[6])["metrics"], "127.0.0.1:9464");
  EXPECT_EQ(nlohmann::json::parse(lines[6])["no_cuda"], "no NVIDIA driver");
}

TEST(EventLogTest, JobStartedSaysThePrecisionAndThatACpuHasNoTf32) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  EventLog log(LogFormat::kJson, f);
  v1::Job job;
  job.set_id("job-8");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_device("cpu");
  log.JobStateChanged(job, v1::JOB_STATE_QUEUED);  // precision unset: fp32
  job.mutable_spec()->set_precision(v1::PRECISION_TF32);
  log.JobStateChanged(job, v1::JOB_STATE_QUEUED);
  job.set_device("cuda:0");
  log.JobStateChanged(job, v1::JOB_STATE_QUEUED);
  job.mutable_spec()->set_precision(v1::PRECISION_BF16);  // convolutions too on the CPU
  log.JobStateChanged(job, v1::JOB_STATE_QUEUED);
  job.set_device("cpu");
  log.JobStateChanged(job, v1::JOB_STATE_QUEUED);
  const std::vector<std::string> lines = Lines(f);
  std::fclose(f);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(nlohmann::json::parse(lines[0])["precision"], "fp32");
  EXPECT_EQ(nlohmann::json::parse(lines[1])["precision"], "tf32 (on cpu: fp32, no TF32 units)");
  EXPECT_EQ(nlohmann::json::parse(lines[2])["precision"], "tf32");
  EXPECT_EQ(nlohmann::json::parse(lines[3])["precision"],
            "bf16 (GEMMs and convolutions in bfloat16, the rest fp32)");
  EXPECT_EQ(nlohmann::json::parse(lines[4])["precision"],
            "bf16 (GEMMs and convolutions in bfloat16, the rest fp32)");
}

TEST(EventLogTest, TheFirstQueuedStateIsTheSubmissionsAndLogsNothing) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  EventLog log(LogFormat::kText, f);
  v1::Job job;
  job.set_id("job-8");
  job.set_state(v1::JOB_STATE_QUEUED);
  log.JobStateChanged(job, v1::JOB_STATE_UNSPECIFIED);
  job.set_reason("resumed by request");
  log.JobStateChanged(job, v1::JOB_STATE_CANCELLED);
  const std::vector<std::string> lines = Lines(f);
  std::fclose(f);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr(" info job_queued job=job-8 reason=\"resumed by request\""));
}

// With --log_format=json every line kilnd writes, on stdout (the ports) and stderr (events,
// the signal, the stop), is one JSON object with an event name: log collectors read both.
TEST(KilndLogLinesTest, WithJsonFormatEveryLineOnStdoutAndStderrIsJson) {
  const std::string root = testing::MakeTempDir("kilnd-json-log");
  kiln::testing::KilndChild kilnd;
  ASSERT_TRUE(kilnd.Start(root + "/state", root + "/data", {"--log_format=json"}, true))
      << kilnd.Stderr();
  EXPECT_GT(kilnd.port(), 0);
  EXPECT_GT(kilnd.metrics_port(), 0);
  ASSERT_EQ(kilnd.Stop(SIGTERM, absl::Seconds(20)), 0);
  const std::string out = kilnd.Stdout(), err = kilnd.Stderr();
  std::vector<std::string> events;
  for (const std::string& text : {out, err}) {
    for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      ASSERT_TRUE(j.is_object()) << "not a JSON line: " << line;
      ASSERT_TRUE(j.contains("event") && j.contains("ts") && j.contains("level")) << line;
      events.push_back(j["event"].get<std::string>());
    }
  }
  EXPECT_THAT(events, ::testing::IsSupersetOf({"listening", "metrics_listening", "server_started",
                                               "signal", "stopped"}));
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace kiln::server
