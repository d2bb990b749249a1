// Generic gRPC clients work against kilnd: grpc.health.v1 answers, and `buf curl` lists the
// services through reflection and calls GetJob (skipped when buf is not installed:
// npm install -g @bufbuild/buf).
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <filesystem>
#include <future>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/daemon.h"
#include "server_test_support.h"
#include "tests/support/connected_channel.h"
#include "tests/support/status_matchers.h"

namespace kiln::server {
namespace {
using ::testing::HasSubstr;

class GenericClientsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::MakeTempDir("kilnd-generic");
    DaemonOptions options;
    options.listen = "127.0.0.1:0";
    options.state_dir = root_ + "/state";
    options.data_dir = root_ + "/data";
    options.device = "cpu";
    testing::WriteToyDataset(options.data_dir + "/toy", 64, 0);
    auto daemon = Daemon::Start(options);
    ASSERT_OK(daemon) << daemon.status();
    daemon_ = *std::move(daemon);
    address_ = absl::StrCat("127.0.0.1:", daemon_->port());
  }
  void TearDown() override {
    daemon_.reset();
    std::filesystem::remove_all(root_);
  }

  std::string root_, address_;
  std::unique_ptr<Daemon> daemon_;
};

// Runs a shell command; returns its stdout and sets *rc to its exit status.
std::string RunShell(const std::string& command, int* rc) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  *rc = pclose(pipe);
  return out;
}

TEST_F(GenericClientsTest, HealthCheckReportsTheTrainingServiceServing) {
  auto channel = kiln::testing::ConnectedChannel(address_);
  grpc::GenericStub stub(channel);
  // HealthCheckRequest{service: "kiln.v1.Training"}, encoded by hand: field 1, length-delimited.
  const std::string service = "kiln.v1.Training";
  std::string request_bytes = std::string("\x0a", 1) + static_cast<char>(service.size()) + service;
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::ClientContext context;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) { done.set_value(s); });
  grpc::Status status = done.get_future().get();
  ASSERT_OK(status) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_OK(response.Dump(&slices));
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // HealthCheckResponse{status: SERVING (1)}.
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
}

TEST_F(GenericClientsTest, BufCurlListsServicesAndCallsGetJob) {
  int rc = 0;
  const std::string buf = RunShell("command -v buf 2>/dev/null", &rc);
  if (rc != 0 || buf.empty()) {
    GTEST_SKIP() << "buf is not installed (npm install -g @bufbuild/buf); skipping the buf curl "
                    "reflection test";
  }
  const std::string base = absl::StrCat("buf curl --protocol grpc --http2-prior-knowledge ");
  const std::string services =
      RunShell(absl::StrCat(base, "--list-services http://", address_, " 2>&1"), &rc);
  EXPECT_EQ(rc, 0) << services;
  EXPECT_THAT(services, HasSubstr("kiln.v1.Training"));
  EXPECT_THAT(services, HasSubstr("grpc.health.v1.Health"));

  auto stub = v1::Training::NewStub(kiln::testing::ConnectedChannel(address_));
  grpc::ClientContext context;
  v1::SubmitJobRequest request;
  *request.mutable_spec() = testing::SmallSpec("toy", 1);
  v1::Job job;
  ASSERT_OK(stub->SubmitJob(&context, request, &job));

  const std::string got =
      RunShell(absl::StrCat(base, "-d '{\"job_id\":\"", job.id(), "\"}' http://", address_,
                            "/kiln.v1.Training/GetJob 2>&1"),
               &rc);
  EXPECT_EQ(rc, 0) << got;
  EXPECT_THAT(got, HasSubstr(absl::StrCat("\"id\": \"", job.id(), "\"")));
  EXPECT_THAT(got, HasSubstr("\"dataset\": \"toy\""));

  const std::string missing = RunShell(absl::StrCat(base, "-d '{\"job_id\":\"job-x\"}' http://",
                                                    address_, "/kiln.v1.Training/GetJob 2>&1"),
                                       &rc);
  EXPECT_NE(rc, 0);
  EXPECT_THAT(missing, HasSubstr("not_found"));
}

}  // namespace
}  // namespace kiln::server
