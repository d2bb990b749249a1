// Unauthenticated grpc.health.v1 Watch streams by the thousand against a kilnd. Before, gRPC's
// default health service took every one: 12,000 took kilnd from 25 to 265 MB. Asserted: past
// --max_health_watches they are refused, kilnd's resident memory stays within a bound, and
// health checks and training calls are still answered.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "hardening_test_support.h"
#include "server_test_support.h"

namespace kiln::server {
namespace {
using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

constexpr int kChannels = 20;
constexpr int kWatchesPerChannel = 100;  // 2,000 in all
constexpr int kMaxWatches = 64;

TEST(HealthWatchTest, ThousandsOfWatchStreamsAreCappedAndKilndStaysSmall) {
  const std::string root = testing::MakeTempDir("kilnd-health-watch");
  testing::KilndProcess kilnd(root + "/state", root + "/data",
                              {"--max_health_watches=" + std::to_string(kMaxWatches)});
  ASSERT_TRUE(kilnd.Start());
  const int64_t before = hardening::ResidentBytes(kilnd.pid());

  struct Watch {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> reader;
  };
  std::vector<std::unique_ptr<Health::Stub>> stubs;
  std::vector<std::unique_ptr<Watch>> watches;
  for (int c = 0; c < kChannels; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.channel_id", c);  // a connection of its own
    stubs.push_back(Health::NewStub(
        grpc::CreateCustomChannel(kilnd.address(), grpc::InsecureChannelCredentials(), args)));
    for (int i = 0; i < kWatchesPerChannel; ++i) {
      auto w = std::make_unique<Watch>();
      w->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      w->reader = stubs.back()->Watch(&w->context, HealthCheckRequest());
      watches.push_back(std::move(w));
    }
  }
  // Each stream's first answer: its status, or the refusal.
  int serving = 0, refused = 0;
  for (auto& w : watches) {
    HealthCheckResponse response;
    if (w->reader->Read(&response)) {
      serving += response.status() == HealthCheckResponse::SERVING;
    } else {
      refused += w->reader->Finish().error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    }
  }
  const int64_t during = hardening::ResidentBytes(kilnd.pid());
  std::printf("[ health   ] %d watch streams: %d served, %d refused; kilnd RSS %.1f -> %.1f MiB\n",
              kChannels * kWatchesPerChannel, serving, refused, before / 1048576.0,
              during / 1048576.0);
  EXPECT_EQ(serving, kMaxWatches);
  EXPECT_EQ(refused, kChannels * kWatchesPerChannel - kMaxWatches);
  EXPECT_LT(during - before, int64_t{64} << 20);
  EXPECT_TRUE(hardening::HealthServing(kilnd.port()));
  auto stub = kilnd.NewStub();
  grpc::ClientContext context;
  v1::ListJobsResponse jobs;
  EXPECT_TRUE(stub->ListJobs(&context, v1::ListJobsRequest(), &jobs).ok());
  for (auto& w : watches) w->context.TryCancel();
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
}

}  // namespace
}  // namespace kiln::server
