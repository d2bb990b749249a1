// The model repository: versions and aliases, what a failed load leaves behind, and unloading
// while a request still holds the model.
#include "server/serving/model_repository.h"

#include <gtest/gtest.h>

#include <fstream>
#include <thread>
#include <vector>

#include "common/sha256.h"
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

TEST(ModelRepositoryTest, LoadsFilesAsNumberedVersionsAndServesTheLatestByDefault) {
  ModelRepository repo;
  auto v1 = repo.Load(FileLoad("m", SharedCheckpoints().mlp_flat));
  ASSERT_OK(v1) << v1.status();
  EXPECT_EQ((*v1)->version(), "1");
  EXPECT_EQ((*v1)->input_shape(), Shape({784}));
  EXPECT_EQ((*v1)->num_classes(), 10);
  auto v2 = repo.Load(FileLoad("m", SharedCheckpoints().mlp_flat_other));
  ASSERT_OK(v2);
  EXPECT_EQ((*v2)->version(), "2");
  EXPECT_EQ((*repo.Find("m", ""))->version(), "2");
  EXPECT_EQ((*repo.Find("m", "1"))->checkpoint_path(), SharedCheckpoints().mlp_flat);
  EXPECT_EQ(*repo.Versions("m"), std::vector<std::string>({"1", "2"}));
  auto missing = repo.Find("m", "9");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(missing.status(), "model \"m\" has no version \"9\" (versions: 1, 2)"))
      << missing.status();
}

TEST(ModelRepositoryTest, QueuesListTheRequestsEachLoadedVersionHoldsWaiting) {
  ModelRepository repo;
  LoadRequest slow = FileLoad("m", SharedCheckpoints().mlp_flat);
  // A batch waits a second for company: requests stay queued meanwhile.
  slow.options.batching = {64, 1000000};
  ASSERT_OK(repo.Load(slow));
  ASSERT_OK(repo.Load(FileLoad("m", SharedCheckpoints().mlp_flat_other)));
  auto held = repo.Find("m", "1");
  ASSERT_OK(held);
  auto depth_of = [&](const std::string& version) -> int64_t {
    for (const VersionQueue& q : repo.Queues()) {
      if (q.model == "m" && q.version == version) return q.queued_requests;
    }
    return -1;  // not listed
  };
  EXPECT_EQ(depth_of("1"), 0);
  EXPECT_EQ(depth_of("2"), 0);

  const std::vector<uint8_t> images = testing::SampleImages(3, 1);
  std::vector<std::thread> clients;
  for (int i = 0; i < 3; ++i) {
    clients.emplace_back([&, i] {
      std::vector<int64_t> classes(1);
      PixelInput input{PixelEncoding::kU8, images.data() + i * testing::kPixels, 1};
      EXPECT_OK((*held)->batcher().Run(input, {nullptr, reinterpret_cast<char*>(classes.data())}));
    });
  }
  bool saw_three = false;
  for (int i = 0; i < 200 && !saw_three; ++i) {
    saw_three = depth_of("1") == 3;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_TRUE(saw_three) << "three requests never showed as queued";
  EXPECT_EQ(depth_of("2"), 0);
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(depth_of("1"), 0);

  ASSERT_OK(repo.Unload("m", "1"));
  EXPECT_EQ(depth_of("1"), -1);
  EXPECT_EQ(depth_of("2"), 0);
}

TEST(ModelRepositoryTest, AliasesFollowTheResolver) {
  const std::string a = SharedCheckpoints().mlp_flat, b = SharedCheckpoints().mlp_flat_other;
  ModelRepositoryOptions options;
  // As the daemon would: "job@best" and "job@latest" name checkpoints by id; versions are
  // numbered per model.
  options.resolver = [&](const std::string& source) -> absl::StatusOr<ResolvedCheckpoint> {
    if (source == "job@best") return ResolvedCheckpoint{a, {"best"}, "", "job@7"};
    if (source == "job@latest") return ResolvedCheckpoint{b, {"latest", "best"}, "", ""};
    return absl::NotFoundError("no checkpoint " + source);
  };
  ModelRepository repo(options);
  ASSERT_OK(repo.Load(FileLoad("job", "job@best")));
  EXPECT_EQ((*repo.Find("job", "best"))->version(), "1");
  EXPECT_EQ(repo.Find("job", "latest").status().code(), absl::StatusCode::kNotFound);
  ASSERT_OK(repo.Load(FileLoad("job", "job@latest")));
  EXPECT_EQ((*repo.Find("job", "best"))->version(), "2");
  EXPECT_EQ((*repo.Find("job", "latest"))->version(), "2");
  EXPECT_EQ((*repo.Find("job", "1"))->checkpoint_path(), a);
  // The source that loads the same checkpoint again: the resolver's pinned form, or as given.
  EXPECT_EQ((*repo.Find("job", "1"))->source(), "job@7");
  EXPECT_EQ((*repo.Find("job", "2"))->source(), "job@latest");
  // Unloading through an alias drops the version and every alias on it.
  ASSERT_OK(repo.Unload("job", "latest"));
  EXPECT_EQ((*repo.Find("job", ""))->version(), "1");
  EXPECT_FALSE(repo.Find("job", "best").ok());
  auto bad = repo.Load(FileLoad("job", "job@nothing"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(bad.status(), "model \"job\": no checkpoint job@nothing"));
}

// A version that could not be restored shows in the index with its reason, answers Unavailable
// while nothing else of its model is loaded, and goes with an unload or a successful load.
TEST(ModelRepositoryTest, AVersionMarkedUnavailableIsIndexedWithItsReasonUntilLoadedOrUnloaded) {
  ModelRepository repo;
  repo.MarkUnavailable("m", "3", "DATA_LOSS: checkpoint damaged");
  bool indexed = false;
  for (const ModelIndexEntry& e : repo.Index()) {
    if (e.name == "m" && e.version == "3") {
      indexed = e.state == "UNAVAILABLE" && e.reason == "DATA_LOSS: checkpoint damaged";
    }
  }
  EXPECT_TRUE(indexed);
  auto find = repo.Find("m", "");
  EXPECT_EQ(find.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(find.status(), "version \"3\" is unavailable: DATA_LOSS")) << find.status();
  // Loading the same label clears it.
  LoadRequest load = FileLoad("m", SharedCheckpoints().mlp_flat);
  load.version = "3";
  ASSERT_OK(repo.Load(load));
  for (const ModelIndexEntry& e : repo.Index()) EXPECT_EQ(e.state, "READY") << e.reason;
  // Unloading a marked version (beside a loaded one) or a model with only marked ones is OK.
  repo.MarkUnavailable("m", "4", "gone");
  ASSERT_OK(repo.Unload("m", "4"));
  EXPECT_OK(repo.Find("m", "3"));
  repo.MarkUnavailable("other", "1", "gone");
  ASSERT_OK(repo.Unload("other"));
  for (const ModelIndexEntry& e : repo.Index()) EXPECT_NE(e.name, "other");
}

// A checkpoint whose file no longer has the digest recorded when it was written is not served.
TEST(ModelRepositoryTest, ACheckpointThatDiffersFromItsRecordedSha256IsDataLoss) {
  const std::string path = SharedCheckpoints().mlp_flat;
  ModelRepositoryOptions options;
  options.resolver = [&](const std::string& source) -> absl::StatusOr<ResolvedCheckpoint> {
    ResolvedCheckpoint r{path, {}, *Sha256OfFile(path), ""};
    if (source == "damaged") r.sha256[0] = r.sha256[0] == '0' ? '1' : '0';
    return r;
  };
  ModelRepository repo(options);
  auto bad = repo.Load(FileLoad("m", "damaged"));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << bad.status();
  EXPECT_TRUE(Contains(bad.status(), "the file was damaged on disk")) << bad.status();
  EXPECT_FALSE(repo.Versions("m").ok());
  EXPECT_OK(repo.Load(FileLoad("m", "intact")));
}

TEST(ModelRepositoryTest, TheOldestVersionsArePushedOut) {
  ModelRepositoryOptions options;
  options.max_versions_per_model = 2;
  ModelRepository repo(options);
  for (int i = 0; i < 3; ++i) ASSERT_OK(repo.Load(FileLoad("m", SharedCheckpoints().cnn)));
  EXPECT_EQ(*repo.Versions("m"), std::vector<std::string>({"2", "3"}));
  // Loading a number again replaces that version in place of adding one; the highest number is
  // the default, whatever was loaded last.
  LoadRequest again = FileLoad("m", SharedCheckpoints().mlp_image);
  again.version = "2";
  ASSERT_OK(repo.Load(again));
  EXPECT_EQ(*repo.Versions("m"), std::vector<std::string>({"2", "3"}));
  EXPECT_EQ((*repo.Find("m", "2"))->checkpoint_path(), SharedCheckpoints().mlp_image);
  EXPECT_EQ((*repo.Find("m", ""))->version(), "3");
  // A number below what latest:2 keeps would be unloaded at once: refused before loading.
  LoadRequest low = FileLoad("m", SharedCheckpoints().cnn);
  low.version = "1";
  auto refused = repo.Load(low);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_TRUE(Contains(refused.status(),
                       "version 1 would not stay loaded: the model's version "
                       "policy latest:2 keeps higher ones (loaded: 2, 3)"))
      << refused.status();
}

// Triton's version policies: latest N, all, or specific numbers, set with any load.
TEST(ModelRepositoryTest, VersionPoliciesChooseWhatStaysLoaded) {
  ModelRepository repo;
  auto load = [&](const std::string& version, std::optional<std::string> policy = {}) {
    LoadRequest r = FileLoad("m", SharedCheckpoints().mlp_flat);
    r.version = version;
    if (policy) r.policy = *VersionPolicy::Parse(*policy);
    return repo.Load(r).status();
  };
  for (int i = 0; i < 5; ++i) ASSERT_OK(load("", "all"));
  EXPECT_EQ(*repo.Versions("m"), std::vector<std::string>({"1", "2", "3", "4", "5"}));
  ASSERT_OK(load("7", "specific:2,7"));
  EXPECT_EQ(*repo.Versions("m"), std::vector<std::string>({"2", "7"}));
  EXPECT_EQ((*repo.Find("m", ""))->version(), "7");
  absl::Status outside = load("8");
  EXPECT_EQ(outside.code(), absl::StatusCode::kFailedPrecondition) << outside;
  EXPECT_TRUE(Contains(outside, "version 8 is not in the model's version policy specific:2,7"));
  ASSERT_OK(load("", "latest:1"));  // the next number after 7
  EXPECT_EQ(*repo.Versions("m"), std::vector<std::string>({"8"}));
  EXPECT_EQ(repo.PolicyOf("m")->ToString(), "latest:1");

  for (const char* bad :
       {"latest:0", "latest:17", "newest", "specific:", "specific:1,x", "specific:01", "all:2"}) {
    auto parsed = VersionPolicy::Parse(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(Contains(parsed.status(), "must be latest:N (N in 1..16), all, or specific:"))
        << parsed.status();
  }
  for (const char* bad : {"v1", "0", "-1", "01", "1.5", "99999999999999999"}) {
    LoadRequest r = FileLoad("m", SharedCheckpoints().mlp_flat);
    r.version = bad;
    auto refused = repo.Load(r);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(Contains(refused.status(), "must be a version number")) << refused.status();
  }
}

TEST(ModelRepositoryTest, AVersionOverTheMemoryLimitIsRefusedNamingTheLayerAndChangesNothing) {
  ModelRepositoryOptions options;
  options.max_memory_bytes = 2'000'000;  // the CNN at max_batch_size 64 needs more
  ModelRepository repo(options);
  LoadRequest big = FileLoad("m", SharedCheckpoints().cnn);
  big.options.batching.max_batch_size = 64;
  auto refused = repo.Load(big);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_TRUE(Contains(refused.status(),
                       "model \"m\" version \"1\": serving it at "
                       "max_batch_size 64 needs "))
      << refused.status();
  EXPECT_TRUE(Contains(refused.status(), "(the most: layer ")) << refused.status();
  EXPECT_TRUE(Contains(refused.status(), "over the limit of 1.9 MiB")) << refused.status();
  EXPECT_FALSE(repo.Versions("m").ok());
  // One sample at a time fits.
  big.options.batching.max_batch_size = 1;
  EXPECT_OK(repo.Load(big));
}

TEST(ModelRepositoryTest, FailedLoadsNameTheProblemAndChangeNothing) {
  testing::TempDir dir;
  std::ofstream(dir.file("junk")) << "not a checkpoint";
  ModelRepository repo;
  struct Case {
    LoadRequest request;
    absl::StatusCode code;
    std::string fragment;
  };
  LoadRequest bad_name = FileLoad("a/b", SharedCheckpoints().mlp_flat);
  LoadRequest bad_batch = FileLoad("m", SharedCheckpoints().mlp_flat);
  bad_batch.options.batching.max_batch_size = 0;
  LoadRequest bad_delay = FileLoad("m", SharedCheckpoints().mlp_flat);
  bad_delay.options.batching.max_queue_delay_us = -5;
  LoadRequest bad_device = FileLoad("m", SharedCheckpoints().mlp_flat);
  bad_device.options.device = "tpu";
  LoadRequest bad_version = FileLoad("m", SharedCheckpoints().mlp_flat);
  bad_version.version = "v1";
  const Case cases[] = {
      {bad_name, absl::StatusCode::kInvalidArgument, "model name \"a/b\" must be"},
      {FileLoad("m", dir.file("none")), absl::StatusCode::kNotFound, "no such file"},
      {FileLoad("m", dir.file("junk")), absl::StatusCode::kDataLoss, "model \"m\" version \"1\": "},
      {bad_batch, absl::StatusCode::kInvalidArgument, "max_batch_size must be in 1..1024"},
      {bad_delay, absl::StatusCode::kInvalidArgument, "max_queue_delay_us must be in"},
      {bad_device, absl::StatusCode::kInvalidArgument, "device \"tpu\""},
      {bad_version, absl::StatusCode::kInvalidArgument, "version \"v1\" must be a version number"},
  };
  for (const Case& c : cases) {
    auto result = repo.Load(c.request);
    EXPECT_EQ(result.status().code(), c.code) << result.status();
    EXPECT_TRUE(Contains(result.status(), c.fragment)) << result.status();
  }
  EXPECT_TRUE(repo.Index().empty());
  EXPECT_EQ(repo.Find("m", "").status().code(), absl::StatusCode::kNotFound);
}

TEST(ModelRepositoryTest, UnloadedModelsAreUnavailableButFinishWhatTheyHold) {
  ModelRepository repo;
  ASSERT_OK(repo.Load(FileLoad("m", SharedCheckpoints().mlp_flat)));
  auto held = repo.Find("m", "");
  ASSERT_OK(held);
  ASSERT_OK(repo.Unload("m"));
  EXPECT_OK(repo.Unload("m"));  // again: nothing changes
  auto gone = repo.Find("m", "");
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(gone.status(), "model \"m\" is unloaded"));
  EXPECT_EQ(repo.Find("never", "").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(repo.Find("never", "").status(), "unknown model \"never\""));
  EXPECT_EQ(repo.Unload("never").code(), absl::StatusCode::kNotFound);

  // The request that held the version before the unload still runs on it.
  const std::vector<uint8_t> image = testing::SampleImages(1, 3);
  std::vector<float> probs(10);
  std::vector<int64_t> classes(1);
  PixelInput input{PixelEncoding::kU8, image.data(), 1};
  EXPECT_OK((*held)->batcher().Run(
      input, {reinterpret_cast<char*>(probs.data()), reinterpret_cast<char*>(classes.data())}));

  auto index = repo.Index();
  ASSERT_EQ(index.size(), 1u);
  EXPECT_EQ(index[0].name, "m");
  EXPECT_EQ(index[0].state, "UNAVAILABLE");
  ASSERT_OK(repo.Load(FileLoad("m", SharedCheckpoints().mlp_flat)));
  EXPECT_EQ((*repo.Find("m", ""))->version(), "2");  // numbers are not reused
  EXPECT_EQ(repo.Index()[0].state, "READY");
}

}  // namespace
}  // namespace kiln::serving
