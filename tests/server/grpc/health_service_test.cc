// kilnd's own grpc.health.v1 service in a real gRPC server: Check answers as gRPC's default
// service does, Watch streams each status change, and Watch streams beyond the limit are refused
// until one closes (gRPC's default service took every one: 12,000 took kilnd from 25 to 265 MB).
#include "server/grpc/health_service.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln::server {
namespace {
using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

class HealthServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    service_ = std::make_unique<HealthService>(kMaxWatches);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = Health::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                                grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }

  struct Watch {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> reader;
  };
  std::unique_ptr<Watch> StartWatch(const std::string& service) {
    auto watch = std::make_unique<Watch>();
    watch->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    HealthCheckRequest request;
    request.set_service(service);
    watch->reader = stub_->Watch(&watch->context, request);
    return watch;
  }

  static constexpr int kMaxWatches = 3;
  std::unique_ptr<HealthService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Health::Stub> stub_;
  int port_ = 0;
};

TEST_F(HealthServiceTest, CheckAnswersTheStatusSetAndNotFoundForAnUnknownService) {
  service_->SetServingStatus("", true);
  service_->SetServingStatus("kiln.v1.Training", false);
  for (const auto& [service, want] :
       std::vector<std::pair<std::string, HealthCheckResponse::ServingStatus>>{
           {"", HealthCheckResponse::SERVING},
           {"kiln.v1.Training", HealthCheckResponse::NOT_SERVING}}) {
    grpc::ClientContext context;
    HealthCheckRequest request;
    request.set_service(service);
    HealthCheckResponse response;
    ASSERT_TRUE(stub_->Check(&context, request, &response).ok()) << service;
    EXPECT_EQ(response.status(), want) << service;
  }
  grpc::ClientContext context;
  HealthCheckRequest request;
  request.set_service("nope");
  HealthCheckResponse response;
  EXPECT_EQ(stub_->Check(&context, request, &response).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(HealthServiceTest, WatchSendsTheStatusThenEachChange) {
  service_->SetServingStatus("kiln.v1.Training", true);
  auto watch = StartWatch("kiln.v1.Training");
  HealthCheckResponse response;
  ASSERT_TRUE(watch->reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
  service_->SetServingStatus("kiln.v1.Training", false);
  ASSERT_TRUE(watch->reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  service_->SetServingStatus("other", false);  // another service's change is not sent
  service_->SetServingStatus("kiln.v1.Training", true);
  ASSERT_TRUE(watch->reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
  // An unknown service is watched as SERVICE_UNKNOWN until it is set.
  auto unknown = StartWatch("later");
  ASSERT_TRUE(unknown->reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVICE_UNKNOWN);
  service_->SetServingStatus("later", true);
  ASSERT_TRUE(unknown->reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
}

TEST_F(HealthServiceTest, WatchesBeyondTheLimitAreRefusedUntilOneCloses) {
  service_->SetServingStatus("", true);
  std::vector<std::unique_ptr<Watch>> open;
  for (int i = 0; i < kMaxWatches; ++i) {
    open.push_back(StartWatch(""));
    HealthCheckResponse response;
    ASSERT_TRUE(open.back()->reader->Read(&response)) << "watch " << i;
  }
  EXPECT_EQ(service_->open_watches(), kMaxWatches);
  auto refused = StartWatch("");
  HealthCheckResponse response;
  EXPECT_FALSE(refused->reader->Read(&response));
  const grpc::Status status = refused->reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("--max_health_watches"));

  open.back()->context.TryCancel();
  open.back()->reader->Finish();
  open.pop_back();
  // The slot comes back once the server has seen the stream end.
  for (int i = 0; i < 100 && service_->open_watches() >= kMaxWatches; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto again = StartWatch("");
  EXPECT_TRUE(again->reader->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
  for (auto& w : open) w->context.TryCancel();
  again->context.TryCancel();
}

}  // namespace
}  // namespace kiln::server
