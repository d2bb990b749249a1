// Bearer-token auth against kilnd as a subprocess: every kind of call but health needs an
// accepted token (unary, server- and client-streaming, inference, reflection), refusals are
// counted in /metrics and never log a token, SIGHUP reloads the token file, and the kiln CLI
// (as a subprocess) says what was refused.
#include <signal.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "cli_test_support.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "inference/grpc_service.grpc.pb.h"
#include "kiln/v1/generation.grpc.pb.h"
#include "kiln/v1/training.grpc.pb.h"
#include "security_test_support.h"
#include "tests/support/connected_channel.h"
#include "tests/support/status_matchers.h"

namespace kiln::security::testing {
namespace {

using client::testing::MakeTempDir;
using client::testing::RunCommand;
using client::testing::RunResult;
using client::testing::WriteFile;
using ::testing::HasSubstr;
using ::testing::Not;

// Distinctive, so a leak into the log cannot hide.
constexpr char kAlpha[] = "tok-alpha-7f3e91c2d8";
constexpr char kBravo[] = "tok-bravo-0b44d6aa51";
constexpr char kCharlie[] = "tok-charlie-93ce0712f4";
constexpr char kWrong[] = "tok-wrong-5a5a5a5a5a";

// The status of one call of each kind kilnd serves, made with `token` (none when empty).
std::vector<std::pair<std::string, grpc::Status>> CallEveryKind(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& token) {
  std::vector<std::pair<std::string, grpc::Status>> statuses;
  auto training = v1::Training::NewStub(channel);
  {
    v1::SubmitJobRequest request;
    request.mutable_spec()->set_preset("mnist-mlp");
    request.mutable_spec()->set_dataset("toy");
    request.mutable_spec()->set_epochs(1);
    v1::Job job;
    statuses.emplace_back("SubmitJob",
                          training->SubmitJob(ContextWithToken(token).get(), request, &job));
  }
  {
    v1::ListJobsResponse jobs;
    statuses.emplace_back("ListJobs", training->ListJobs(ContextWithToken(token).get(),
                                                         v1::ListJobsRequest(), &jobs));
  }
  {
    auto context = ContextWithToken(token);
    v1::WatchJobRequest request;
    request.set_job_id("job-none");
    auto reader = training->WatchJob(context.get(), request);
    v1::JobEvent event;
    int events = 0;
    while (reader->Read(&event)) ++events;
    grpc::Status status = reader->Finish();
    if (events > 0) status = grpc::Status(grpc::StatusCode::INTERNAL, "WatchJob sent events");
    statuses.emplace_back("WatchJob", status);
  }
  {
    auto context = ContextWithToken(token);
    v1::Dataset dataset;
    auto writer = training->UploadDataset(context.get(), &dataset);
    v1::UploadDatasetRequest part;
    part.mutable_header()->set_name("sneaked-in");
    writer->Write(part);
    part.mutable_chunk()->set_file_name("train-images-idx3-ubyte");
    part.mutable_chunk()->set_data("not idx");
    writer->Write(part);
    writer->WritesDone();
    statuses.emplace_back("UploadDataset", writer->Finish());
  }
  {
    v1::DeleteDatasetRequest request;
    request.set_name("no-such-dataset");
    v1::DeleteDatasetResponse response;
    statuses.emplace_back("DeleteDataset", training->DeleteDataset(ContextWithToken(token).get(),
                                                                   request, &response));
  }
  auto inference = inference::GRPCInferenceService::NewStub(channel);
  {
    inference::ModelInferRequest request;
    request.set_model_name("digits");
    inference::ModelInferResponse response;
    statuses.emplace_back("ModelInfer",
                          inference->ModelInfer(ContextWithToken(token).get(), request, &response));
  }
  {
    inference::ServerLiveResponse response;
    statuses.emplace_back("ServerLive",
                          inference->ServerLive(ContextWithToken(token).get(),
                                                inference::ServerLiveRequest(), &response));
  }
  {
    v1::GenerateRequest request;
    request.set_model_name("digits");
    request.set_text_input("a");
    auto context = ContextWithToken(token);
    auto reader = v1::GenerationService::NewStub(channel)->Generate(context.get(), request);
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
    }
    statuses.emplace_back("Generate", reader->Finish());
  }
  std::string services;
  statuses.emplace_back("reflection", ListServicesByReflection(channel, token, &services));
  return statuses;
}

grpc::Status HealthCheck(const std::shared_ptr<grpc::Channel>& channel) {
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckResponse response;
  return health->Check(ContextWithToken("").get(), grpc::health::v1::HealthCheckRequest(),
                       &response);
}

grpc::Status ListJobs(const std::shared_ptr<grpc::Channel>& channel, const std::string& token,
                      int* count = nullptr) {
  v1::ListJobsResponse jobs;
  grpc::Status status = v1::Training::NewStub(channel)->ListJobs(ContextWithToken(token).get(),
                                                                 v1::ListJobsRequest(), &jobs);
  if (count != nullptr) *count = jobs.jobs_size();
  return status;
}

class BearerAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = MakeTempDir("kiln-auth");
    tokens_file_ = root_ + "/tokens";
    WriteFile(tokens_file_, std::string("# kilnd's clients\n") + kAlpha +
                                "\n\n  # retired: tok-old\n" + kBravo + "\n");
    client::testing::WriteToyDataset(root_ + "/data/toy", 64, 16);
    kilnd_ = std::make_unique<KilndUnderTest>(root_);
    ASSERT_TRUE(kilnd_->Start({"--auth_tokens_file=" + tokens_file_})) << kilnd_->Stderr();
    channel_ = kiln::testing::ConnectedChannel(kilnd_->address());
  }
  void TearDown() override {
    kilnd_.reset();
    std::filesystem::remove_all(root_);
  }

  double AuthFailures(const std::string& reason) {
    auto scrape = ScrapeMetrics(kilnd_->metrics_port());
    EXPECT_OK(scrape) << scrape.status();
    return scrape.ok() ? SampleValue(*scrape, "kiln_auth_failures_total{reason=\"" + reason + "\"}")
                       : -1;
  }
  RunResult Kiln(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv = {KILN_PATH, "--server", kilnd_->address()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, env, absl::Seconds(30));
  }
  // Sends SIGHUP and waits for the `count`th log line of `event`.
  void Reload(const std::string& event, int count) {
    kilnd_->Signal(SIGHUP);
    ASSERT_TRUE(kilnd_->WaitForStderr(event, count, absl::Seconds(10))) << kilnd_->Stderr();
  }

  std::string root_, tokens_file_;
  std::unique_ptr<KilndUnderTest> kilnd_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(BearerAuthTest, EveryCallWithoutATokenIsUnauthenticatedAndDoesNothing) {
  for (const auto& [call, status] : CallEveryKind(channel_, "")) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << call << ": " << status.error_message();
    EXPECT_EQ(status.error_message(), "missing bearer token") << call;
  }
  // Nothing was submitted or uploaded.
  int jobs = -1;
  ASSERT_OK(ListJobs(channel_, kAlpha, &jobs));
  EXPECT_EQ(jobs, 0);
  v1::ListDatasetsResponse datasets;
  ASSERT_OK(v1::Training::NewStub(channel_)->ListDatasets(ContextWithToken(kAlpha).get(),
                                                          v1::ListDatasetsRequest(), &datasets));
  for (const v1::Dataset& d : datasets.datasets()) EXPECT_NE(d.name(), "sneaked-in");
}

TEST_F(BearerAuthTest, AWrongTokenOrSchemeIsUnauthenticated) {
  for (const auto& [call, status] : CallEveryKind(channel_, kWrong)) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << call << ": " << status.error_message();
    EXPECT_EQ(status.error_message(), "invalid bearer token") << call;
  }
  grpc::ClientContext basic;
  basic.AddMetadata("authorization", std::string("Basic ") + kAlpha);
  v1::ListJobsResponse jobs;
  grpc::Status status =
      v1::Training::NewStub(channel_)->ListJobs(&basic, v1::ListJobsRequest(), &jobs);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(status.error_message(), "invalid bearer token");
  // A client cannot pass for the interceptor's verdict.
  grpc::ClientContext forged;
  forged.AddMetadata("kiln-auth-verdict", "accepted");
  status = v1::Training::NewStub(channel_)->ListJobs(&forged, v1::ListJobsRequest(), &jobs);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(BearerAuthTest, AnAcceptedTokenReachesEveryService) {
  for (const std::string token : {kAlpha, kBravo}) {
    for (const auto& [call, status] : CallEveryKind(channel_, token)) {
      EXPECT_NE(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << call << ": " << status.error_message();
    }
  }
  const auto statuses = CallEveryKind(channel_, kAlpha);
  for (const auto& [call, status] : statuses) {
    if (call == "SubmitJob" || call == "ListJobs" || call == "ServerLive" || call == "reflection") {
      EXPECT_OK(status) << call << ": " << status.error_message();
    }
    // Past auth, to the unknown job, model or dataset.
    if (call == "WatchJob" || call == "ModelInfer" || call == "DeleteDataset" ||
        call == "Generate") {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << call;
    }
  }
  std::string services;
  ASSERT_OK(ListServicesByReflection(channel_, kBravo, &services));
  EXPECT_THAT(services, HasSubstr("kiln.v1.Training"));
  EXPECT_THAT(services, HasSubstr("inference.GRPCInferenceService"));
  EXPECT_THAT(services, HasSubstr("kiln.v1.GenerationService"));
}

TEST_F(BearerAuthTest, HealthNeedsNoToken) {
  grpc::Status status = HealthCheck(channel_);
  EXPECT_OK(status) << status.error_message();
  EXPECT_EQ(AuthFailures("missing"), 0);
  // kiln health asks the health service, so it passes without a token.
  RunResult r = Kiln({"health"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(": SERVING"));
  // Serving's row comes from the health service too, not an error for the missing token.
  EXPECT_THAT(r.out, ::testing::ContainsRegex("inference.GRPCInferenceService +SERVING"));
  EXPECT_THAT(r.out, HasSubstr("details need a token"));
}

TEST_F(BearerAuthTest, RefusalsAreCountedByReason) {
  EXPECT_EQ(AuthFailures("missing"), 0);
  EXPECT_EQ(AuthFailures("invalid"), 0);
  const size_t calls = CallEveryKind(channel_, "").size();
  CallEveryKind(channel_, kWrong);
  CallEveryKind(channel_, kWrong);
  CallEveryKind(channel_, kAlpha);
  HealthCheck(channel_);
  EXPECT_EQ(AuthFailures("missing"), static_cast<double>(calls));
  EXPECT_EQ(AuthFailures("invalid"), static_cast<double>(2 * calls));
  // The gRPC request counter sees the refusals' code too.
  auto scrape = ScrapeMetrics(kilnd_->metrics_port());
  ASSERT_OK(scrape) << scrape.status();
  EXPECT_EQ(SampleValue(*scrape,
                        "kiln_grpc_requests_total{code=\"UNAUTHENTICATED\",method=\"/kiln.v1."
                        "Training/ListJobs\"}"),
            3);
}

TEST_F(BearerAuthTest, SighupReloadsTheTokenFile) {
  ASSERT_OK(ListJobs(channel_, kAlpha));
  WriteFile(tokens_file_, std::string(kBravo) + "\n" + kCharlie + "\n");
  Reload("auth_tokens_reloaded", 1);
  EXPECT_THAT(kilnd_->Stderr(),
              HasSubstr("auth_tokens_reloaded file=" + tokens_file_ + " tokens=2"));
  grpc::Status removed = ListJobs(channel_, kAlpha);
  EXPECT_EQ(removed.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(removed.error_message(), "invalid bearer token");
  EXPECT_OK(ListJobs(channel_, kBravo));
  EXPECT_OK(ListJobs(channel_, kCharlie));
}

TEST_F(BearerAuthTest, ABadFileOnReloadKeepsTheOldTokens) {
  WriteFile(tokens_file_, "# emptied by mistake\n\n");
  Reload("auth_tokens_reload_failed", 1);
  EXPECT_THAT(kilnd_->Stderr(), HasSubstr("holds no token"));
  EXPECT_THAT(kilnd_->Stderr(), HasSubstr("kept_tokens=2"));
  EXPECT_OK(ListJobs(channel_, kAlpha));
  EXPECT_OK(ListJobs(channel_, kBravo));

  std::filesystem::remove(tokens_file_);
  Reload("auth_tokens_reload_failed", 2);
  EXPECT_THAT(kilnd_->Stderr(), HasSubstr("cannot read"));
  EXPECT_OK(ListJobs(channel_, kAlpha));

  WriteFile(tokens_file_, std::string(kAlpha) + "\nbad token with spaces\n");
  Reload("auth_tokens_reload_failed", 3);
  // Words after a token are its identity's fields now: these are not.
  EXPECT_THAT(kilnd_->Stderr(), HasSubstr("line 2: field 1 is not user=, team= or role="));
  EXPECT_OK(ListJobs(channel_, kBravo));
  // Still serving, and still stoppable.
  EXPECT_OK(HealthCheck(channel_));
  EXPECT_EQ(kilnd_->Stop(), 0);
}

TEST_F(BearerAuthTest, TokensNeverReachTheLog) {
  CallEveryKind(channel_, kAlpha);
  CallEveryKind(channel_, kWrong);
  Kiln({"--token", kWrong, "jobs"});
  WriteFile(tokens_file_, std::string(kCharlie) + "\nbad token\n");
  Reload("auth_tokens_reload_failed", 1);
  WriteFile(tokens_file_, std::string(kCharlie) + "\n");
  Reload("auth_tokens_reloaded", 1);
  ASSERT_EQ(kilnd_->Stop(), 0);
  const std::string log = kilnd_->Stderr();
  EXPECT_THAT(log, HasSubstr("auth=bearer tokens=2"));  // the log says how many, not which
  for (const char* token : {kAlpha, kBravo, kCharlie, kWrong, "tok-old"}) {
    EXPECT_THAT(log, Not(HasSubstr(token)));
  }
}

TEST_F(BearerAuthTest, TheCliSaysTheCredentialsWereRefused) {
  RunResult r = Kiln({"jobs"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("UNAUTHENTICATED: kilnd refused the credentials: missing bearer "
                               "token; pass --token or set KILN_TOKEN"));
  r = Kiln({"--token", kWrong, "watch", "job-none"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("kilnd refused the credentials: invalid bearer token"));
  r = Kiln({"--token", kAlpha, "jobs"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = Kiln({"datasets"}, {std::string("KILN_TOKEN=") + kBravo});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("toy"));
}

TEST(BearerAuthStartupTest, AMissingOrEmptyTokenFileStopsKilnd) {
  const std::string root = MakeTempDir("kiln-auth-start");
  auto start = [&root](const std::string& tokens_file) {
    return RunCommand(
        {KILND_PATH, "--listen=127.0.0.1:0", "--metrics_listen=", "--state_dir=" + root + "/state",
         "--data_dir=" + root + "/data", "--auth_tokens_file=" + tokens_file},
        {}, absl::Seconds(30));
  };
  RunResult r = start(root + "/absent");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("kilnd: --auth_tokens_file=" + root + "/absent: cannot read"));
  WriteFile(root + "/empty", "# to do\n");
  r = start(root + "/empty");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("kilnd: --auth_tokens_file=" + root + "/empty: holds no token"));
  std::filesystem::remove_all(root);
}

// Tokens and TLS together: the token travels inside the TLS channel and is checked the same way.
TEST(BearerAuthOverTlsTest, TokensAreCheckedOnTlsConnectionsToo) {
  const std::string root = MakeTempDir("kiln-auth-tls");
  std::filesystem::create_directories(root + "/pki");
  auto pki = MakeTestPki(root + "/pki");
  ASSERT_OK(pki) << pki.status();
  WriteFile(root + "/tokens", std::string(kAlpha) + "\n");
  KilndUnderTest kilnd(root);
  ASSERT_TRUE(kilnd.Start({"--tls_cert=" + pki->server_cert, "--tls_key=" + pki->server_key,
                           "--auth_tokens_file=" + root + "/tokens"}));
  auto channel = TlsChannel(kilnd.address(), pki->ca_cert);
  for (const auto& [call, status] : CallEveryKind(channel, "")) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << call;
  }
  EXPECT_OK(ListJobs(channel, kAlpha));
  EXPECT_OK(HealthCheck(channel));
  RunResult r =
      RunCommand({KILN_PATH, "--server", kilnd.address(), "--tls-ca", pki->ca_cert, "jobs"}, {},
                 absl::Seconds(30));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("missing bearer token"));
  r = RunCommand({KILN_PATH, "--server", kilnd.address(), "--tls-ca", pki->ca_cert, "jobs"},
                 {std::string("KILN_TOKEN=") + kAlpha}, absl::Seconds(30));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(kilnd.Stop(), 0);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace kiln::security::testing
