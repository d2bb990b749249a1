// The rendezvous store and the Gloo communicator: values of allreduce, broadcast and barrier
// over 2-3 ranks as processes on 127.0.0.1, and failures that end in errors, not hangs.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "engine/distributed/file_key_value_store.h"
#include "engine/distributed/gloo_communicator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/distributed/rank_processes.h"
#include "tests/distributed/temp_folder.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

using ::kiln::testing::MakeTempFolder;
using ::kiln::testing::RankExit;
using ::kiln::testing::RunRanks;
using ::testing::HasSubstr;

// In a child: prints what failed and gives the exit code for it.
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

absl::StatusOr<std::unique_ptr<GlooCommunicator>> Join(const std::string& dir, int rank, int size,
                                                       absl::Duration timeout = absl::Seconds(20)) {
  auto store = FileKeyValueStore::Open(dir + "/store");
  if (!store.ok()) return store.status();
  GlooOptions options;
  options.timeout = timeout;
  return GlooCommunicator::Create(store->get(), rank, size, options);
}

TEST(FileKeyValueStore, SetThenGetReturnsTheValue) {
  const std::string dir = MakeTempFolder();
  auto store = FileKeyValueStore::Open(dir + "/kv");
  ASSERT_OK(store);
  ASSERT_OK((*store)->Set("rank/0", std::string("addr\0ess", 8)));
  auto value = (*store)->Get("rank/0", absl::Seconds(1));
  ASSERT_OK(value);
  EXPECT_EQ(*value, std::string("addr\0ess", 8));
  ASSERT_OK((*store)->Set("rank/0", "replaced"));
  EXPECT_EQ(*(*store)->Get("rank/0", absl::Seconds(1)), "replaced");
  // The slash stays inside the file's name: no sub-folder was made.
  EXPECT_EQ(access((dir + "/kv/rank%2f0").c_str(), F_OK), 0);
}

TEST(FileKeyValueStore, GetTimesOutNamingTheKey) {
  const std::string dir = MakeTempFolder();
  auto store = FileKeyValueStore::Open(dir + "/kv");
  ASSERT_OK(store);
  const auto start = std::chrono::steady_clock::now();
  auto value = (*store)->Get("nccl_unique_id", absl::Milliseconds(200));
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(value.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(value.status().message(), HasSubstr("nccl_unique_id"));
  EXPECT_GE(waited, 0.19);
  EXPECT_LT(waited, 2.0);
  absl::Status wait = (*store)->Wait({"a", "b"}, absl::Milliseconds(50));
  EXPECT_THAT(wait.message(), HasSubstr("a, b"));
}

TEST(FileKeyValueStore, WaitSeesAKeySetByAnotherProcess) {
  const std::string dir = MakeTempFolder();
  auto exits = RunRanks(2, [&](int rank) {
    auto store = FileKeyValueStore::Open(dir + "/kv");
    if (!store.ok()) return Fail(rank, store.status().ToString());
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      return (*store)->Set("ready", "1").ok() ? 0 : 1;
    }
    absl::Status s = (*store)->Wait({"ready"}, absl::Seconds(10));
    return s.ok() ? 0 : Fail(rank, s.ToString());
  });
  ExpectAllSucceeded(exits);
}

TEST(GlooCommunicator, AllreduceSumsEveryRanksValues) {
  const std::string dir = MakeTempFolder();
  auto exits = RunRanks(3, [&](int rank) {
    auto comm = Join(dir, rank, 3);
    if (!comm.ok()) return Fail(rank, comm.status().ToString());
    if ((*comm)->rank() != rank || (*comm)->size() != 3) return Fail(rank, "rank or size");
    // Small and large (several of Gloo's 1 MiB segments) buffers; values whose sums are exact.
    for (size_t n : {size_t{1}, size_t{1000}, size_t{700000}}) {
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 1024) * 0.5f + rank;
      absl::Status s = (*comm)->AllreduceSum(v.data(), n);
      if (!s.ok()) return Fail(rank, s.ToString());
      for (size_t i = 0; i < n; ++i) {
        const float want = 3 * (static_cast<float>(i % 1024) * 0.5f) + 3;
        if (v[i] != want)
          return Fail(rank, "element " + std::to_string(i) + " of " + std::to_string(n) + " is " +
                                std::to_string(v[i]));
      }
    }
    return 0;
  });
  ExpectAllSucceeded(exits);
}

TEST(GlooCommunicator, OneRankIsAWorldOfItsOwn) {
  const std::string dir = MakeTempFolder();
  auto exits = RunRanks(1, [&](int rank) {
    auto comm = Join(dir, rank, 1);
    if (!comm.ok()) return Fail(rank, comm.status().ToString());
    float v[2] = {1.5f, -2};
    if (!(*comm)->AllreduceSum(v, 2).ok() || v[0] != 1.5f || v[1] != -2) return Fail(rank, "sum");
    if (!(*comm)->Broadcast(v, sizeof(v), 0).ok() || !(*comm)->Barrier().ok()) {
      return Fail(rank, "broadcast or barrier");
    }
    return 0;
  });
  ExpectAllSucceeded(exits);
}

TEST(GlooCommunicator, BroadcastCopiesTheRootsBytes) {
  const std::string dir = MakeTempFolder();
  auto exits = RunRanks(3, [&](int rank) {
    auto comm = Join(dir, rank, 3);
    if (!comm.ok()) return Fail(rank, comm.status().ToString());
    std::vector<unsigned char> bytes(777);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * (rank + 1));
    absl::Status s = (*comm)->Broadcast(bytes.data(), bytes.size(), /*root=*/1);
    if (!s.ok()) return Fail(rank, s.ToString());
    for (size_t i = 0; i < bytes.size(); ++i) {
      if (bytes[i] != static_cast<unsigned char>(i * 2)) return Fail(rank, "byte differs");
    }
    if ((*comm)->Broadcast(bytes.data(), 1, 3).code() != absl::StatusCode::kInvalidArgument) {
      return Fail(rank, "root 3 of 3 accepted");
    }
    return 0;
  });
  ExpectAllSucceeded(exits);
}

TEST(GlooCommunicator, BarrierWaitsForTheLastRank) {
  const std::string dir = MakeTempFolder();
  auto exits = RunRanks(3, [&](int rank) {
    auto comm = Join(dir, rank, 3);
    if (!comm.ok()) return Fail(rank, comm.status().ToString());
    // Everyone is connected; now rank 2 is late by 500 ms.
    if (absl::Status s = (*comm)->Barrier(); !s.ok()) return Fail(rank, s.ToString());
    if (rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const auto start = std::chrono::steady_clock::now();
    if (absl::Status s = (*comm)->Barrier(); !s.ok()) return Fail(rank, s.ToString());
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (rank != 2 && waited < 0.4)
      return Fail(rank, "barrier returned after " + std::to_string(waited) + " s");
    return 0;
  });
  ExpectAllSucceeded(exits);
}

TEST(GlooCommunicator, RankThatNeverJoinsFailsTheRendezvousWithinTheTimeout) {
  const std::string dir = MakeTempFolder();
  // Rank 0 of 2 alone: rank 1 never publishes its address.
  auto exits = RunRanks(1, [&](int rank) {
    auto comm = Join(dir, rank, 2, absl::Seconds(1));
    if (comm.ok()) return Fail(rank, "joined without rank 1");
    std::fprintf(stderr, "expected error: %s\n", comm.status().ToString().c_str());
    const std::string msg(comm.status().message());
    return msg.find("rank 0 of 2") != std::string::npos ? 0 : Fail(rank, msg);
  });
  ASSERT_EQ(exits.size(), 1u);
  EXPECT_EQ(exits[0].exit_code, 0);
  EXPECT_LT(exits[0].seconds, 10);
}

TEST(GlooCommunicator, DeadPeerMakesTheNextCollectiveFailWithinTheTimeout) {
  const std::string dir = MakeTempFolder();
  auto exits = RunRanks(2, [&](int rank) {
    auto comm = Join(dir, rank, 2, absl::Seconds(2));
    if (!comm.ok()) return Fail(rank, comm.status().ToString());
    float x = 1;
    if (absl::Status s = (*comm)->AllreduceSum(&x, 1); !s.ok()) return Fail(rank, s.ToString());
    if (rank == 1) _exit(7);  // dies without a word
    absl::Status s = (*comm)->AllreduceSum(&x, 1);
    if (s.ok()) return Fail(rank, "allreduce with a dead peer succeeded");
    std::fprintf(stderr, "expected error: %s\n", s.ToString().c_str());
    if (s.message().find("allreduce failed on rank 0 of 2") == absl::string_view::npos) {
      return Fail(rank, s.ToString());
    }
    // The communicator is spent: the next call fails at once with the same error.
    return (*comm)->Barrier() == s ? 0 : Fail(rank, "second error differs");
  });
  EXPECT_EQ(exits[0].exit_code, 0);
  EXPECT_EQ(exits[1].exit_code, 7);
  EXPECT_LT(exits[0].seconds, 15);
}

}  // namespace
}  // namespace kiln
