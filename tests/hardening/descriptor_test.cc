// kilnd under a low open-file limit (prlimit 256:256), flooded with plain TCP connections that
// never send a byte, many more than it has descriptors for. Before the connection guard, gRPC's
// listener met EMFILE at accept and stopped accepting for good, and a running job failed to open
// its checkpoint file. Asserted: the job still writes every checkpoint and succeeds, kilnd closes
// the silent connections after the handshake timeout, and new clients are served again while the
// flood's sockets are still open on our side.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "hardening_test_support.h"
#include "server_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::server {
namespace {
namespace fs = std::filesystem;
using testing::GetJob;
using testing::WaitFor;
using testing::WaitForState;

constexpr int kFloodConnections = 600;  // over twice the descriptor limit
constexpr int kEpochs = 6;

// A non-blocking connect to 127.0.0.1:port that is never written to; -1 if no socket was left.
int SilentConnection(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));  // EINPROGRESS is fine
  return fd;
}

// Floods a kilnd started with `limit_flags` (and a 256-descriptor limit) while a job runs.
void FloodWhileAJobRuns(const std::string& limit_flag) {
  const std::string root = testing::MakeTempDir("kilnd-descriptors");
  testing::WriteToyDataset(root + "/data/toy", 512, 128);
  testing::KilndProcess kilnd(
      root + "/state", root + "/data",
      {"--step_delay=20ms", limit_flag, "--connection_handshake_timeout=1s"});
  kilnd.set_launcher({"/usr/bin/prlimit", "--nofile=256:256", "--"});
  ASSERT_TRUE(kilnd.Start()) << "kilnd did not start under a 256-descriptor limit";
  auto stub = kilnd.NewStub();

  v1::JobSpec spec = testing::SmallSpec("toy", kEpochs);
  spec.mutable_checkpoint_policy()->set_every_n_epochs(1);
  const std::string id = testing::SubmitJob(*stub, spec);
  ASSERT_TRUE(WaitForState(*stub, id, v1::JOB_STATE_RUNNING, absl::Seconds(30)));

  const int before = hardening::OpenDescriptors(kilnd.pid());
  std::vector<int> flood;
  for (int i = 0; i < kFloodConnections; ++i) {
    const int fd = SilentConnection(kilnd.port());
    ASSERT_GE(fd, 0) << "the test ran out of sockets after " << i;
    flood.push_back(fd);
  }
  absl::SleepFor(absl::Milliseconds(300));  // let kilnd's accept loop meet the flood
  const int during = hardening::OpenDescriptors(kilnd.pid());

  v1::Job job;
  WaitFor(
      [&] {
        job = GetJob(*stub, id);
        return job.state() == v1::JOB_STATE_SUCCEEDED || job.state() == v1::JOB_STATE_FAILED;
      },
      absl::Seconds(60));
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  EXPECT_EQ(testing::ListCheckpoints(*stub, id).size(), static_cast<size_t>(kEpochs));

  // The flood's sockets stay open on this side; kilnd must have closed its ends of them and
  // still accept: a new channel's calls succeed within a few handshake timeouts.
  const absl::Time flooded = absl::Now();
  bool served = false;
  while (!served && absl::Now() < flooded + absl::Seconds(20)) {
    auto fresh = kilnd.NewStub();
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::GetJobRequest request;
    request.set_job_id(id);
    v1::Job answer;
    served = fresh->GetJob(&context, request, &answer).ok();
  }
  EXPECT_TRUE(served) << "no new connection was served within 20 s of the flood";
  const int after = hardening::OpenDescriptors(kilnd.pid());
  std::printf("[ fds      ] kilnd descriptors: %d before the flood of %d, %d during, %d after\n",
              before, kFloodConnections, during, after);
  EXPECT_LE(during, 256);
  EXPECT_TRUE(hardening::HealthServing(kilnd.port()));
  for (int fd : flood) close(fd);
  std::error_code ec;
  fs::remove_all(root, ec);
}

// Capped by --max_connections: 64 open at once, the rest closed on accept.
TEST(DescriptorTest, AFloodOfSilentConnectionsNeitherStopsTheListenerNorStarvesAJob) {
  if (access("/usr/bin/prlimit", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/prlimit (util-linux)";
  FloodWhileAJobRuns("--max_connections=64");
}

// Capped by the reserve alone: connections take descriptors up to 256 - 64, never the 64 kept
// for the job's checkpoint and the store.
TEST(DescriptorTest, ConnectionsNeverTakeTheDescriptorsReservedForFiles) {
  if (access("/usr/bin/prlimit", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/prlimit (util-linux)";
  FloodWhileAJobRuns("--reserved_descriptors=64");
}

}  // namespace
}  // namespace kiln::server
