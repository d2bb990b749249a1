// Channels for tests that are connected before the test makes its first call.
//
// Debian 12's gRPC (1.51) reads errno after other calls have run between connect(2) and the check
// for EINPROGRESS, so now and then an in-progress connect is reported as failed with a stale
// errno ("ipv4:127.0.0.1:PORT: No such file or directory"; grpc/grpc#35064, fixed in 1.61). The
// channel then sits in TRANSIENT_FAILURE for its reconnect backoff, and every fail-fast call
// made meanwhile fails. A test that meant to exercise kiln, not gRPC's connect, waits for READY
// instead, which rides through one such attempt.
#ifndef KILN_TESTS_SUPPORT_CONNECTED_CHANNEL_H_
#define KILN_TESTS_SUPPORT_CONNECTED_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/time/time.h"

namespace kiln::testing {

// A channel to `target` with `credentials`, READY when it returns. A test failure (not a crash)
// if it is not READY within `timeout`; the channel is returned either way so calls on it report
// why.
std::shared_ptr<grpc::Channel> ConnectedChannel(
    const std::string& target, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    const grpc::ChannelArguments& arguments = {}, absl::Duration timeout = absl::Seconds(30));

// The same in plaintext.
std::shared_ptr<grpc::Channel> ConnectedChannel(const std::string& target,
                                                const grpc::ChannelArguments& arguments = {});

}  // namespace kiln::testing

#endif  // KILN_TESTS_SUPPORT_CONNECTED_CHANNEL_H_
