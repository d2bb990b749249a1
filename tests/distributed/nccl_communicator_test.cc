// NcclCommunicator on CUDA devices, ranks as forked processes (each child opens CUDA itself;
// the parent never does). NcclSingleGpu needs one device, NcclMultiGpu two; each skips, saying
// why, where the machine has fewer. Not run where this was written (no GPU): scripts/device-check
// runs them on the device machine.
#include "engine/cuda/nccl_communicator.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/distributed/file_key_value_store.h"
#include "engine/model/model.h"
#include "engine/reference_configs.h"
#include "engine/trainer.h"
#include "gtest/gtest.h"
#include "tests/distributed/rank_processes.h"
#include "tests/distributed/temp_folder.h"
#include "tests/engine/synthetic_data.h"

namespace kiln {
namespace {

using ::kiln::testing::MakeTempFolder;
using ::kiln::testing::RunRanks;

constexpr int kSkip = 77;  // a child's exit code for "this machine cannot run it"

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// In a child: the backend of cuda:`device`, or exit kSkip leaving the reason in `dir`/skip.
std::unique_ptr<CudaBackend> BackendOrSkip(int device, const std::string& dir) {
  auto backend = CudaBackend::Create(device);
  if (backend.ok()) return std::move(*backend);
  std::ofstream(dir + "/skip") << "no cuda:" << device << ": " << backend.status().ToString();
  std::fflush(nullptr);
  _exit(kSkip);
}

int Fail(int rank, const std::string& what) {
  std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
  return 1;
}

// Runs `size` ranks; skips the test when a rank found no device, else expects every rank to
// succeed.
void RunOrSkip(int size, const std::string& dir, const std::function<int(int)>& body) {
  auto exits = RunRanks(size, body, 120);
  for (int r = 0; r < size; ++r) {
    if (exits[r].exit_code == kSkip) GTEST_SKIP() << Slurp(dir + "/skip");
  }
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(exits[r].exit_code, 0) << "rank " << r << " (signal " << exits[r].signal << ")";
  }
}

TEST(NcclSingleGpu, OneRankCollectivesOnTheBackendsStream) {
  const std::string dir = MakeTempFolder();
  RunOrSkip(1, dir, [&](int rank) {
    std::unique_ptr<CudaBackend> backend = BackendOrSkip(0, dir);
    auto store = FileKeyValueStore::Open(dir + "/store");
    if (!store.ok()) return Fail(rank, store.status().ToString());
    auto comm = NcclCommunicator::Create(store->get(), 0, 1, backend.get());
    if (!comm.ok()) return Fail(rank, comm.status().ToString());
    auto t = backend->Allocate(DType::kF32, {1000});
    if (!t.ok()) return Fail(rank, t.status().ToString());
    std::vector<float> host(1000);
    for (int i = 0; i < 1000; ++i) host[i] = 0.25f * i;
    if (!backend->CopyFromHost(host.data(), 4000, &*t).ok()) return Fail(rank, "copy");
    // In stream order with the backend's own ops: scale, then sum over the one rank.
    if (!backend->Scale(1000, 2.0f, t->f32()).ok()) return Fail(rank, "scale");
    if (absl::Status s = (*comm)->AllreduceSum(t->f32(), 1000); !s.ok()) {
      return Fail(rank, s.ToString());
    }
    if (absl::Status s = (*comm)->Broadcast(t->raw(), 4000, 0); !s.ok()) {
      return Fail(rank, s.ToString());
    }
    if (absl::Status s = (*comm)->Barrier(); !s.ok()) return Fail(rank, s.ToString());
    std::vector<float> back(1000);
    if (!backend->CopyToHost(*t, back.data(), 4000).ok()) return Fail(rank, "copy back");
    for (int i = 0; i < 1000; ++i) {
      if (back[i] != 0.5f * i) return Fail(rank, "element " + std::to_string(i));
    }
    return 0;
  });
}

// What one GPU can check beyond a single communicator: two communicators of one rank each on one
// device, each on its own backend's stream, interleaved, keep their own data (a wrong buffer,
// count or stream would mix or lose them); and a healthy communicator's teardown (finalize, then
// destroy) returns promptly. A real reduction over two ranks needs two GPUs (NcclMultiGpu).
TEST(NcclSingleGpu, TwoCommunicatorsOnOneDeviceKeepTheirOwnDataAndCloseQuickly) {
  const std::string dir = MakeTempFolder();
  RunOrSkip(1, dir, [&](int rank) {
    constexpr int kCount = 4099;  // not a multiple of NCCL's chunking
    std::unique_ptr<CudaBackend> backends[2] = {BackendOrSkip(0, dir), BackendOrSkip(0, dir)};
    std::unique_ptr<NcclCommunicator> comms[2];
    Tensor data[2];
    for (int c = 0; c < 2; ++c) {
      auto store = FileKeyValueStore::Open(absl::StrCat(dir, "/store-", c));
      if (!store.ok()) return Fail(rank, store.status().ToString());
      auto comm = NcclCommunicator::Create(store->get(), 0, 1, backends[c].get());
      if (!comm.ok()) return Fail(rank, comm.status().ToString());
      comms[c] = std::move(*comm);
      auto t = backends[c]->Allocate(DType::kF32, {kCount});
      if (!t.ok()) return Fail(rank, t.status().ToString());
      data[c] = *t;
      std::vector<float> host(kCount);
      for (int i = 0; i < kCount; ++i) host[i] = (c == 0 ? 1.0f : -1.0f) * i;
      if (!backends[c]->CopyFromHost(host.data(), kCount * 4, &data[c]).ok()) {
        return Fail(rank, "copy");
      }
    }
    for (int round = 0; round < 3; ++round) {
      for (int c = 0; c < 2; ++c) {
        if (!backends[c]->Scale(kCount, 2.0f, data[c].f32()).ok()) return Fail(rank, "scale");
        if (absl::Status s = comms[c]->AllreduceSum(data[c].f32(), kCount); !s.ok()) {
          return Fail(rank, s.ToString());
        }
      }
    }
    for (int c = 0; c < 2; ++c) {
      std::vector<float> back(kCount);
      if (!backends[c]->CopyToHost(data[c], back.data(), kCount * 4).ok())
        return Fail(rank, "back");
      for (int i = 0; i < kCount; ++i) {
        if (back[i] != (c == 0 ? 8.0f : -8.0f) * i) {
          return Fail(rank, absl::StrCat("communicator ", c, " element ", i, ": ", back[i]));
        }
      }
    }
    const auto closing = std::chrono::steady_clock::now();
    for (auto& comm : comms) comm.reset();
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - closing).count();
    return took < 5 ? 0 : Fail(rank, absl::StrCat("teardown took ", took, " s"));
  });
}

TEST(NcclSingleGpu, RankThatNeverJoinsTimesOutAndAborts) {
  const std::string dir = MakeTempFolder();
  const auto start = std::chrono::steady_clock::now();
  RunOrSkip(1, dir, [&](int rank) {
    std::unique_ptr<CudaBackend> backend = BackendOrSkip(0, dir);
    auto store = FileKeyValueStore::Open(dir + "/store");
    if (!store.ok()) return Fail(rank, store.status().ToString());
    NcclOptions options;
    options.timeout = absl::Seconds(5);
    // Rank 0 of 2 publishes the id, and rank 1 never comes.
    auto comm = NcclCommunicator::Create(store->get(), 0, 2, backend.get(), options);
    if (comm.ok()) return Fail(rank, "created without rank 1");
    std::fprintf(stderr, "expected error: %s\n", comm.status().ToString().c_str());
    const bool named = comm.status().message().find("on rank 0 of 2") != absl::string_view::npos;
    return comm.status().code() == absl::StatusCode::kDeadlineExceeded && named
               ? 0
               : Fail(rank, comm.status().ToString());
  });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 60);
}

TEST(NcclMultiGpu, TwoRanksOnTwoDevicesTrainTheMlpInStep) {
  const std::string dir = MakeTempFolder();
  RunOrSkip(2, dir, [&](int rank) {
    // Both ranks look for the second device first: a rank 0 that went ahead alone would wait
    // for rank 1 until the timeout.
    BackendOrSkip(1, dir).reset();
    std::unique_ptr<CudaBackend> backend = BackendOrSkip(rank, dir);
    auto store = FileKeyValueStore::Open(dir + "/store");
    if (!store.ok()) return Fail(rank, store.status().ToString());
    auto comm = NcclCommunicator::Create(store->get(), rank, 2, backend.get());
    if (!comm.ok()) return Fail(rank, comm.status().ToString());
    const Dataset train = testing::BandsDataset(512, 10, 28, 11);
    const Dataset test = testing::BandsDataset(200, 10, 28, 12);
    TrainConfig config = MnistMlpReference();
    config.batch_size = 64;
    config.optimizer.lr = 0.01f;
    config.communicator = comm->get();
    auto trainer = Trainer::Create(config, backend.get(), &train, &test);
    if (!trainer.ok()) return Fail(rank, trainer.status().ToString());
    if (absl::Status s = (*trainer)->Run({}); !s.ok()) return Fail(rank, s.ToString());
    std::string bytes;
    for (const NamedParameter& p : (*trainer)->model().parameters()) {
      std::string b(p.param->value.bytes(), '\0');
      if (!backend->CopyToHost(p.param->value, b.data(), b.size()).ok()) return Fail(rank, "copy");
      bytes += b;
    }
    std::ofstream(absl::StrCat(dir, "/rank", rank, ".model"), std::ios::binary) << bytes;
    return 0;
  });
  if (::testing::Test::IsSkipped()) return;
  EXPECT_TRUE(Slurp(dir + "/rank0.model") == Slurp(dir + "/rank1.model"))
      << "the two ranks' weights differ";
}

}  // namespace
}  // namespace kiln
