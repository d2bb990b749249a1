#include "tests/support/connected_channel.h"

#include <gtest/gtest.h>

#include <chrono>

namespace kiln::testing {

std::shared_ptr<grpc::Channel> ConnectedChannel(
    const std::string& target, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    const grpc::ChannelArguments& arguments, absl::Duration timeout) {
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(target, credentials, arguments);
  // WaitForConnected keeps asking for a connection through TRANSIENT_FAILURE until the deadline.
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
  if (!channel->WaitForConnected(deadline)) {
    ADD_FAILURE() << "no gRPC connection to " << target << " within " << timeout
                  << " (channel state " << channel->GetState(/*try_to_connect=*/false) << ")";
  }
  return channel;
}

std::shared_ptr<grpc::Channel> ConnectedChannel(const std::string& target,
                                                const grpc::ChannelArguments& arguments) {
  return ConnectedChannel(target, grpc::InsecureChannelCredentials(), arguments);
}

}  // namespace kiln::testing
