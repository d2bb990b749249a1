// GrpcKeyValueStore against a real kilnd: the rendezvous store of a job of two external workers,
// reached with the job's worker token, as kiln-worker reaches it.
#include "server/worker/grpc_key_value_store.h"

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/worker/coordinator_connection.h"
#include "tests/server/server_test_support.h"

namespace kiln::worker {
namespace {

using ::testing::HasSubstr;

class GrpcKeyValueStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = server::testing::MakeTempDir("kv_store");
    server::testing::WriteToyDataset(dir + "/data/toy", 64, 16);
    kilnd_ = std::make_unique<server::testing::KilndProcess>(dir + "/state", dir + "/data",
                                                             std::vector<std::string>{});
    ASSERT_TRUE(kilnd_->Start()) << "kilnd did not start";
    training_ = kilnd_->NewStub();
    v1::JobSpec spec = server::testing::SmallSpec("toy", 1);
    spec.set_workers(2);
    spec.set_external_workers(true);
    job_ = server::testing::SubmitJob(*training_, spec);
    ASSERT_FALSE(job_.empty());
    // The attempt, and with it the store, exists once the job runs (waiting for its workers).
    ASSERT_TRUE(
        server::testing::WaitForState(*training_, job_, v1::JOB_STATE_RUNNING, absl::Seconds(30)));
    v1::GetWorkerTokenRequest request;
    request.set_job_id(job_);
    v1::GetWorkerTokenResponse response;
    grpc::ClientContext context;
    grpc::Status status = training_->GetWorkerToken(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    token_ = response.token();
    // RUNNING is announced a moment before the attempt takes workers (and serves its store).
    auto connection = Connect(token_);
    ASSERT_NE(connection, nullptr);
    GrpcKeyValueStore store(connection.get(), job_);
    ASSERT_TRUE(server::testing::WaitFor(
        [&] { return store.Set("probe", "1").code() != absl::StatusCode::kFailedPrecondition; },
        absl::Seconds(30)));
  }

  std::unique_ptr<CoordinatorConnection> Connect(const std::string& token) {
    CoordinatorOptions options;
    options.address = kilnd_->address();
    options.token = token;
    absl::StatusOr<std::unique_ptr<CoordinatorConnection>> c = CoordinatorConnection::Open(options);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  std::unique_ptr<server::testing::KilndProcess> kilnd_;
  std::unique_ptr<v1::Training::Stub> training_;
  std::string job_, token_;
};

TEST_F(GrpcKeyValueStoreTest, SetThenGetReturnsTheValueFromAnotherConnection) {
  auto writer = Connect(token_);
  auto reader = Connect(token_);
  ASSERT_NE(writer, nullptr);
  ASSERT_NE(reader, nullptr);
  GrpcKeyValueStore set_side(writer.get(), job_), get_side(reader.get(), job_);
  const std::string value("gloo\0address", 12);
  absl::Status set = set_side.Set("rank_0", value);
  ASSERT_TRUE(set.ok()) << set;
  absl::StatusOr<std::string> got = get_side.Get("rank_0", absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, value);
  set = set_side.Set("rank_0", "replaced");
  ASSERT_TRUE(set.ok()) << set;
  EXPECT_EQ(*get_side.Get("rank_0", absl::Seconds(5)), "replaced");
  EXPECT_TRUE(get_side.Wait({"rank_0"}, absl::Seconds(5)).ok());
}

TEST_F(GrpcKeyValueStoreTest, GetAndWaitTimeOutNamingTheKeys) {
  auto connection = Connect(token_);
  ASSERT_NE(connection, nullptr);
  GrpcKeyValueStore store(connection.get(), job_);
  absl::StatusOr<std::string> missing = store.Get("nccl_unique_id", absl::Milliseconds(300));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(missing.status().message(), HasSubstr("nccl_unique_id"));
  absl::Status set = store.Set("a", "1");
  ASSERT_TRUE(set.ok()) << set;
  absl::Status wait = store.Wait({"a", "b", "c"}, absl::Milliseconds(300));
  EXPECT_EQ(wait.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(wait.message(), HasSubstr("b, c"));
}

TEST_F(GrpcKeyValueStoreTest, AWrongTokenIsRefused) {
  auto connection = Connect("not-" + token_);
  ASSERT_NE(connection, nullptr);
  GrpcKeyValueStore store(connection.get(), job_);
  absl::Status set = store.Set("rank_0", "x");
  EXPECT_EQ(set.code(), absl::StatusCode::kUnauthenticated) << set;
  EXPECT_THAT(set.message(), HasSubstr("rank_0"));
  EXPECT_EQ(store.Get("rank_0", absl::Seconds(1)).status().code(),
            absl::StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace kiln::worker
