// The serving memory budget, through the model repository: all versions in memory together stay
// within max_total_memory_bytes, counted by each version's memory plan; a load past it is
// refused naming the need, what is held and the flag, and leaves nothing behind; versions that
// go give their share back; loads at once cannot both take the same room.
#include "server/serving/serving_memory_budget.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/serving/model_repository.h"
#include "tests/serving/serving_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::serving {
namespace {

using testing::SharedCheckpoints;

LoadRequest FileLoad(const std::string& model, const std::string& path) {
  LoadRequest r;
  r.model = model;
  r.source = path;
  r.options.device = "cpu";
  return r;
}

bool Contains(const absl::Status& s, const std::string& fragment) {
  return std::string(s.message()).find(fragment) != std::string::npos;
}

// What one version of the flat MLP at the default max_batch_size plans to use.
int64_t FlatMlpBytes() {
  ModelRepository repo;
  auto v = repo.Load(FileLoad("probe", SharedCheckpoints().mlp_flat));
  EXPECT_OK(v);
  return v.ok() ? (*v)->memory_bytes() : 0;
}

// Room for two versions of the flat MLP, not three.
ModelRepositoryOptions RoomForTwo(int64_t one) {
  ModelRepositoryOptions options;
  options.max_total_memory_bytes = one * 2 + one / 2;
  return options;
}

TEST(ServingMemoryBudgetTest, EachLoadedVersionHoldsItsPlannedBytes) {
  const int64_t one = FlatMlpBytes();
  ASSERT_GT(one, 0);
  ModelRepository repo;
  EXPECT_EQ(repo.MemoryInUse().bytes, 0);
  ASSERT_OK(repo.Load(FileLoad("a", SharedCheckpoints().mlp_flat)));
  ASSERT_OK(repo.Load(FileLoad("a", SharedCheckpoints().mlp_flat_other)));
  const ServingMemoryUse use = repo.MemoryInUse();
  EXPECT_EQ(use.bytes, 2 * one);
  EXPECT_EQ(use.versions, 2);
  EXPECT_EQ(use.loading, 0);
  EXPECT_EQ(use.loading_bytes, 0);
}

TEST(ServingMemoryBudgetTest, ALoadPastTheBudgetIsRefusedNamingItAndLeavesNothing) {
  const int64_t one = FlatMlpBytes();
  ModelRepository repo(RoomForTwo(one));
  ASSERT_OK(repo.Load(FileLoad("a", SharedCheckpoints().mlp_flat)));
  ASSERT_OK(repo.Load(FileLoad("b", SharedCheckpoints().mlp_flat)));
  auto refused = repo.Load(FileLoad("c", SharedCheckpoints().mlp_flat));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  for (const char* fragment :
       {"model \"c\" version \"1\": serving it at max_batch_size 64 needs ",
        "but the 2 versions in memory hold ", "all served versions may use (",
        " bytes, --max_serving_memory_bytes): unload a version or a model to make room"}) {
    EXPECT_TRUE(Contains(refused.status(), fragment)) << fragment << "\n" << refused.status();
  }
  EXPECT_FALSE(repo.Versions("c").ok());
  EXPECT_EQ(repo.MemoryInUse().bytes, 2 * one);
  EXPECT_EQ(repo.MemoryInUse().versions, 2);

  // One version alone over the whole budget says so.
  ModelRepositoryOptions tiny;
  tiny.max_total_memory_bytes = one / 2;
  ModelRepository small(tiny);
  auto alone = small.Load(FileLoad("a", SharedCheckpoints().mlp_flat));
  EXPECT_EQ(alone.status().code(), absl::StatusCode::kResourceExhausted) << alone.status();
  EXPECT_TRUE(Contains(alone.status(), "of memory, more than the ")) << alone.status();
  EXPECT_EQ(small.MemoryInUse().versions, 0);
}

TEST(ServingMemoryBudgetTest, VersionsThatGoGiveTheirBytesBack) {
  const int64_t one = FlatMlpBytes();
  ModelRepository repo(RoomForTwo(one));
  ASSERT_OK(repo.Load(FileLoad("a", SharedCheckpoints().mlp_flat)));
  ASSERT_OK(repo.Load(FileLoad("b", SharedCheckpoints().mlp_flat)));
  EXPECT_FALSE(repo.Load(FileLoad("c", SharedCheckpoints().mlp_flat)).ok());
  // Unloading a whole model makes room.
  ASSERT_OK(repo.Unload("a"));
  EXPECT_EQ(repo.MemoryInUse().bytes, one);
  ASSERT_OK(repo.Load(FileLoad("c", SharedCheckpoints().mlp_flat)));

  // Replacing a version (the same number) needs room for both while the new one loads.
  LoadRequest again = FileLoad("b", SharedCheckpoints().mlp_flat_other);
  again.version = "1";
  auto replaced = repo.Load(again);
  EXPECT_EQ(replaced.status().code(), absl::StatusCode::kResourceExhausted) << replaced.status();
  EXPECT_EQ((*repo.Find("b", "1"))->checkpoint_path(), SharedCheckpoints().mlp_flat);
  ASSERT_OK(repo.Unload("c", "1"));  // one version by number
  ASSERT_OK(repo.Load(again));
  EXPECT_EQ((*repo.Find("b", "1"))->checkpoint_path(), SharedCheckpoints().mlp_flat_other);
  EXPECT_EQ(repo.MemoryInUse().bytes, one);  // the replaced version gave its share back

  // A version its policy pushes out gives its share back too.
  LoadRequest newest = FileLoad("b", SharedCheckpoints().mlp_flat);
  newest.policy = *VersionPolicy::Parse("latest:1");
  ASSERT_OK(repo.Load(newest));
  EXPECT_EQ(*repo.Versions("b"), std::vector<std::string>({"2"}));
  EXPECT_EQ(repo.MemoryInUse().bytes, one);
  EXPECT_EQ(repo.MemoryInUse().versions, 1);
}

// A load that reserved its share and then failed (the checkpoint's header reads, its tensors do
// not) gives it back.
TEST(ServingMemoryBudgetTest, ALoadThatFailsAfterReservingGivesItsShareBack) {
  testing::TempDir dir;
  const std::string cut = dir.file("cut.safetensors");
  std::filesystem::copy_file(SharedCheckpoints().mlp_flat, cut);
  std::filesystem::resize_file(cut, std::filesystem::file_size(cut) - 64);
  ModelRepository repo;
  auto failed = repo.Load(FileLoad("m", cut));
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(repo.MemoryInUse().bytes, 0) << failed.status();
  EXPECT_EQ(repo.MemoryInUse().versions, 0);
}

// Loads at once each reserve under the budget's lock before they read their checkpoint: with
// room for one, exactly one of several concurrent loads goes through.
TEST(ServingMemoryBudgetTest, ConcurrentLoadsCannotOvershootTheBudget) {
  const int64_t one = FlatMlpBytes();
  ModelRepositoryOptions options;
  options.max_total_memory_bytes = one + one / 2;
  ModelRepository repo(options);
  constexpr int kLoads = 6;
  std::vector<absl::Status> outcomes(kLoads);
  std::vector<std::thread> loads;
  for (int i = 0; i < kLoads; ++i) {
    loads.emplace_back([&, i] {
      outcomes[i] =
          repo.Load(FileLoad(absl::StrCat("m", i), SharedCheckpoints().mlp_flat)).status();
    });
  }
  for (std::thread& t : loads) t.join();
  int loaded = 0;
  for (const absl::Status& s : outcomes) {
    if (s.ok()) {
      ++loaded;
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    }
  }
  EXPECT_EQ(loaded, 1);
  EXPECT_EQ(repo.MemoryInUse().versions, 1);
  EXPECT_EQ(repo.MemoryInUse().bytes, one);
  EXPECT_EQ(repo.Index().size(), 1u);
}

// A version held by a request after it was unloaded is still in memory: its share comes back when
// the request lets go.
TEST(ServingMemoryBudgetTest, AnUnloadedVersionStillHeldKeepsItsShareUntilReleased) {
  const int64_t one = FlatMlpBytes();
  ModelRepository repo;
  ASSERT_OK(repo.Load(FileLoad("m", SharedCheckpoints().mlp_flat)));
  auto held = repo.Find("m", "");
  ASSERT_OK(held);
  ASSERT_OK(repo.Unload("m"));
  EXPECT_EQ(repo.MemoryInUse().bytes, one);
  held = absl::UnavailableError("let go");
  EXPECT_EQ(repo.MemoryInUse().bytes, 0);
}

}  // namespace
}  // namespace kiln::serving
