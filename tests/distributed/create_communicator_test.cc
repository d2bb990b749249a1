// CreateCommunicator: Gloo for ranks on CPU backends (2 ranks as processes meeting through a
// FileKeyValueStore), and the refusal of a CUDA backend in a build without NCCL.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "engine/backend_registry.h"
#include "engine/distributed/file_key_value_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/distributed/rank_processes.h"
#include "tests/distributed/temp_folder.h"

namespace kiln {
namespace {

using ::kiln::testing::MakeTempFolder;
using ::kiln::testing::RankExit;
using ::kiln::testing::RunRanks;

// In a child: prints what failed and gives the exit code for it.
int Fail(int rank, const std::string& what) {
  std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
  return 1;
}

TEST(CreateCommunicator, GivesCpuBackendsAGlooCommunicatorThatSums) {
  const std::string dir = MakeTempFolder();
  const std::vector<RankExit> exits = RunRanks(2, [&](int rank) {
    // Engine code only in the children (rank_processes.h).
    auto backend = CreateBackend("cpu", {/*threads=*/1});
    if (!backend.ok()) return Fail(rank, backend.status().ToString());
    auto store = FileKeyValueStore::Open(dir + "/store");
    if (!store.ok()) return Fail(rank, store.status().ToString());
    CommunicatorOptions options;
    options.timeout = absl::Seconds(20);
    auto comm = CreateCommunicator(backend->get(), store->get(), rank, 2, options);
    if (!comm.ok()) return Fail(rank, comm.status().ToString());
    if ((*comm)->device() != DeviceKind::kCpu) return Fail(rank, "not a host communicator");
    if ((*comm)->rank() != rank || (*comm)->size() != 2) return Fail(rank, "rank or size");
    float v[2] = {1.0f + rank, -0.5f};
    absl::Status s = (*comm)->AllreduceSum(v, 2);
    if (!s.ok()) return Fail(rank, s.ToString());
    if (v[0] != 3.0f || v[1] != -1.0f) return Fail(rank, "wrong sum");
    return 0;
  });
  for (size_t r = 0; r < exits.size(); ++r) {
    EXPECT_EQ(exits[r].exit_code, 0) << "rank " << r << " (signal " << exits[r].signal
                                     << ", timed out " << exits[r].timed_out << ")";
  }
}

#if !defined(KILN_WITH_NCCL)
TEST(CreateCommunicator, RefusesACudaBackendWithoutNccl) {
  auto backend = CreateBackend("cuda:0");
  if (!backend.ok()) GTEST_SKIP() << "no CUDA device: " << backend.status();
  const std::string dir = MakeTempFolder();
  auto store = FileKeyValueStore::Open(dir + "/store");
  ASSERT_TRUE(store.ok()) << store.status();
  auto comm = CreateCommunicator(backend->get(), store->get(), 0, 2);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(comm.status().message(), ::testing::HasSubstr("without NCCL"));
}
#endif

}  // namespace
}  // namespace kiln
