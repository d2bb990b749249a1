// TimedCommunicator over real Gloo ranks (forked processes on 127.0.0.1): it forwards every
// collective unchanged and counts the bytes and the time of AllreduceSum only.
#include "engine/distributed/timed_communicator.h"

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "engine/distributed/file_key_value_store.h"
#include "engine/distributed/gloo_communicator.h"
#include "gtest/gtest.h"
#include "tests/distributed/rank_processes.h"
#include "tests/distributed/temp_folder.h"

namespace kiln {
namespace {

using ::kiln::testing::MakeTempFolder;
using ::kiln::testing::RankExit;
using ::kiln::testing::RunRanks;

int Fail(int rank, const std::string& what) {
  std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
  return 1;
}

void ExpectAllSucceeded(const std::vector<RankExit>& exits) {
  for (size_t r = 0; r < exits.size(); ++r) {
    EXPECT_EQ(exits[r].exit_code, 0) << "rank " << r << " (signal " << exits[r].signal
                                     << ", timed out " << exits[r].timed_out << ")";
  }
}

absl::StatusOr<std::unique_ptr<TimedCommunicator>> JoinTimed(const std::string& dir, int rank,
                                                             int size) {
  auto store = FileKeyValueStore::Open(dir + "/store");
  if (!store.ok()) return store.status();
  GlooOptions options;
  options.timeout = absl::Seconds(20);
  auto gloo = GlooCommunicator::Create(store->get(), rank, size, options);
  if (!gloo.ok()) return gloo.status();
  return std::make_unique<TimedCommunicator>(*std::move(gloo));
}

TEST(TimedCommunicator, CountsAllreduceBytesAndKeepsTheSums) {
  const std::string dir = MakeTempFolder();
  auto exits = RunRanks(2, [&](int rank) {
    auto comm = JoinTimed(dir, rank, 2);
    if (!comm.ok()) return Fail(rank, comm.status().ToString());
    TimedCommunicator& timed = **comm;
    if (timed.rank() != rank || timed.size() != 2 || timed.device() != DeviceKind::kCpu) {
      return Fail(rank, "rank, size or device not forwarded");
    }
    if (timed.allreduce_bytes() != 0 || timed.allreduce_seconds() != 0) {
      return Fail(rank, "a new communicator has counted something");
    }
    std::vector<float> v(1000, static_cast<float>(rank + 1));
    if (!timed.AllreduceSum(v.data(), v.size()).ok()) return Fail(rank, "first allreduce");
    if (v[0] != 3 || v[999] != 3) return Fail(rank, "the sum is not every rank's");
    if (!timed.AllreduceSum(v.data(), 10).ok()) return Fail(rank, "second allreduce");
    if (timed.allreduce_bytes() != 1010 * 4) {
      return Fail(rank, "counted " + std::to_string(timed.allreduce_bytes()) + " bytes");
    }
    // Broadcast and barrier pass through but are not gradient traffic.
    int word = rank == 0 ? 42 : 0;
    if (!timed.Broadcast(&word, sizeof(word), 0).ok() || word != 42) return Fail(rank, "broadcast");
    if (!timed.Barrier().ok()) return Fail(rank, "barrier");
    if (timed.allreduce_bytes() != 1010 * 4) return Fail(rank, "broadcast or barrier counted");
    timed.Reset();
    if (timed.allreduce_bytes() != 0 || timed.allreduce_seconds() != 0) return Fail(rank, "reset");
    return 0;
  });
  ExpectAllSucceeded(exits);
}

TEST(TimedCommunicator, CountsTheTimeAnAllreduceWaitsForItsPeer) {
  const std::string dir = MakeTempFolder();
  auto exits = RunRanks(2, [&](int rank) {
    auto comm = JoinTimed(dir, rank, 2);
    if (!comm.ok()) return Fail(rank, comm.status().ToString());
    if (!(*comm)->Barrier().ok()) return Fail(rank, "barrier");
    // Rank 1 comes late, so rank 0's allreduce cannot finish before it arrives.
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    float x = 1;
    if (!(*comm)->AllreduceSum(&x, 1).ok() || x != 2) return Fail(rank, "allreduce");
    if (rank == 0 && (*comm)->allreduce_seconds() < 0.2) {
      return Fail(rank, "waited " + std::to_string((*comm)->allreduce_seconds()) + " s");
    }
    if ((*comm)->allreduce_seconds() <= 0) return Fail(rank, "no time counted");
    return 0;
  });
  ExpectAllSucceeded(exits);
}

TEST(TimedCommunicator, PassesOnTheErrorOfADeadPeer) {
  const std::string dir = MakeTempFolder();
  auto exits = RunRanks(2, [&](int rank) {
    auto comm = JoinTimed(dir, rank, 2);
    if (!comm.ok()) return Fail(rank, comm.status().ToString());
    if (!(*comm)->Barrier().ok()) return Fail(rank, "barrier");
    if (rank == 1) return 0;  // leaves without the allreduce
    float x = 1;
    absl::Status s = (*comm)->AllreduceSum(&x, 1);
    if (s.ok()) return Fail(rank, "an allreduce without its peer succeeded");
    if ((*comm)->allreduce_bytes() != 4) return Fail(rank, "a failed allreduce was not counted");
    return 0;
  });
  ExpectAllSucceeded(exits);
}

}  // namespace
}  // namespace kiln
