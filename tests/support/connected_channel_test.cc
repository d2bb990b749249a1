// ConnectedChannel waits through a failed connection attempt instead of handing the test a
// channel in TRANSIENT_FAILURE.
#include "tests/support/connected_channel.h"

#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "inference/grpc_service.grpc.pb.h"
#include "tests/support/loopback_port.h"

namespace kiln::testing {
namespace {

// Calls a method no server has: UNIMPLEMENTED means a server answered, UNAVAILABLE that none did.
grpc::Status CallAnything(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1), response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/kiln.test.Nothing/Call", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status status) { done.set_value(status); });
  return done.get_future().get();
}

TEST(ConnectedChannelTest, AFirstAttemptThatFailsIsRetriedUntilReady) {
  const std::string target = absl::StrCat("127.0.0.1:", UnusedLoopbackPort());
  // The first attempt is refused: the server starts only after the channel has tried.
  inference::GRPCInferenceService::Service unimplemented;
  std::unique_ptr<grpc::Server> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    grpc::ServerBuilder builder;
    builder.AddListeningPort(target, grpc::InsecureServerCredentials());
    builder.RegisterService(&unimplemented);  // a sync server needs one service to run
    server = builder.BuildAndStart();
  });
  const std::shared_ptr<grpc::Channel> channel = ConnectedChannel(target);
  starter.join();
  ASSERT_NE(server, nullptr) << "could not listen on " << target;
  EXPECT_EQ(channel->GetState(/*try_to_connect=*/false), GRPC_CHANNEL_READY);
  // A fail-fast call goes straight through.
  EXPECT_EQ(CallAnything(channel).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  server->Shutdown();
}

}  // namespace
}  // namespace kiln::testing
