// Restoring recorded deployments at start: within the serving memory budget (what does not fit
// is UNAVAILABLE with the reason, the rest load), and never again a record that an earlier start
// died loading (out of memory), until it is loaded or unloaded by hand.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "server/serving/inference_service.h"
#include "server/serving/model_repository.h"
#include "tests/serving/serving_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::serving {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::IndexOf;
using testing::LoadMessage;
using testing::SharedCheckpoints;
using ::testing::StartsWith;

// Records of a:1, a:2 and b:9 (the flat MLP each), made by loading them through a service.
class DeploymentRestoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ModelRepository repo;
    InferenceService service(&repo, Options());
    const std::string flat = SharedCheckpoints().mlp_flat;
    ASSERT_OK(service.LoadModel(LoadMessage("a", {{"checkpoint", flat}})));
    ASSERT_OK(service.LoadModel(LoadMessage("a", {{"checkpoint", flat}})));
    ASSERT_OK(service.LoadModel(LoadMessage("b", {{"checkpoint", flat}, {"version", "9"}})));
    for (const char* model : {"a", "b"}) {
      for (const DeploymentRecord& r : recorded_[model]) records_.push_back(r);
    }
    ASSERT_EQ(records_.size(), 3u);
    one_version_ = (*repo.Find("a", "1"))->memory_bytes();
    recorded_.clear();
  }

  // Records what the service records, and notes what Restore tells.
  InferenceServiceOptions Options() {
    InferenceServiceOptions options;
    options.default_deployment.device = "cpu";
    options.record_deployments = [this](const std::string& model,
                                        const std::vector<DeploymentRecord>& versions) {
      recorded_[model] = versions;
      return absl::OkStatus();
    };
    options.note_restore = [this](const DeploymentRecord& record, RestorePhase phase) {
      notes_.push_back((phase == RestorePhase::kLoading ? "loading " : "settled ") + record.model +
                       " " + record.version);
    };
    return options;
  }

  std::vector<DeploymentRecord> records_;
  int64_t one_version_ = 0;
  std::map<std::string, std::vector<DeploymentRecord>> recorded_;
  std::vector<std::string> notes_;
};

TEST_F(DeploymentRestoreTest, WhatDoesNotFitTheBudgetIsUnavailableAndTheRestLoad) {
  ModelRepositoryOptions room_for_two;
  room_for_two.max_total_memory_bytes = one_version_ * 2 + one_version_ / 2;
  ModelRepository repo(room_for_two);
  InferenceService service(&repo, Options());
  const std::vector<std::string> failures = service.Restore(records_);
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_THAT(failures[0], AllOf(StartsWith("b 9: RESOURCE_EXHAUSTED: "),
                                 HasSubstr("--max_serving_memory_bytes")));
  const std::vector<std::string> index = IndexOf(repo);
  ASSERT_EQ(index.size(), 3u);
  EXPECT_EQ(index[0], "a:1:READY:");
  EXPECT_EQ(index[1], "a:2:READY:");
  EXPECT_THAT(index[2], AllOf(StartsWith("b:9:UNAVAILABLE:RESOURCE_EXHAUSTED: model \"b\" "
                                         "version \"9\": serving it at max_batch_size 64 needs "),
                              HasSubstr("but the 2 versions in memory hold ")));
  EXPECT_EQ(repo.MemoryInUse().versions, 2);
  // Nothing was recorded anew: the records stay as they were, for the next start.
  EXPECT_TRUE(recorded_.empty());
}

TEST_F(DeploymentRestoreTest, ARecordAnEarlierStartDiedLoadingIsNotLoadedAgain) {
  records_[1].restore_interrupted = true;  // a:2
  // And one that fails for a reason of its own, which is tried again at every start.
  DeploymentRecord gone = records_[0];
  gone.model = "c";
  gone.version = "1";
  gone.request.set_model_name("c");
  (*gone.request.mutable_parameters())["checkpoint"].set_string_param("/no/such.safetensors");
  records_.push_back(gone);

  ModelRepository repo;
  InferenceService service(&repo, Options());
  const std::vector<std::string> failures = service.Restore(records_);
  EXPECT_THAT(failures, ElementsAre(std::string("a 2: ") + kInterruptedRestoreReason,
                                    StartsWith("c 1: NOT_FOUND: ")));
  EXPECT_THAT(IndexOf(repo),
              ElementsAre("a:1:READY:", std::string("a:2:UNAVAILABLE:") + kInterruptedRestoreReason,
                          "b:9:READY:", StartsWith("c:1:UNAVAILABLE:NOT_FOUND")));
  // Each record loaded is noted before and after, whatever its outcome; the held one never is.
  EXPECT_THAT(notes_, ElementsAre("loading a 1", "settled a 1", "loading b 9", "settled b 9",
                                  "loading c 1", "settled c 1"));
  EXPECT_TRUE(recorded_.empty());
}

// Held back, a record stays so (the daemon keeps its mark) until it is loaded again by hand, which
// records it anew, or unloaded, which forgets it.
TEST_F(DeploymentRestoreTest, AHeldRecordIsClearedByLoadingOrUnloadingIt) {
  records_[1].restore_interrupted = true;  // a:2
  records_[2].restore_interrupted = true;  // b:9
  ModelRepository repo;
  InferenceService service(&repo, Options());
  EXPECT_EQ(service.Restore(records_).size(), 2u);
  EXPECT_FALSE(repo.Find("a", "2").ok());
  EXPECT_EQ(repo.Find("b", "").status().code(), absl::StatusCode::kUnavailable);

  ASSERT_OK(service.LoadModel(records_[1].request));
  EXPECT_THAT(IndexOf(repo),
              ElementsAre("a:1:READY:", "a:2:READY:",
                          std::string("b:9:UNAVAILABLE:") + kInterruptedRestoreReason));
  ASSERT_EQ(recorded_["a"].size(), 2u);
  EXPECT_FALSE(recorded_["a"][1].restore_interrupted);

  inference::RepositoryModelUnloadRequest unload;
  unload.set_model_name("b");
  ASSERT_OK(service.UnloadModel(unload));
  EXPECT_THAT(IndexOf(repo), ElementsAre("a:1:READY:", "a:2:READY:"));
  ASSERT_EQ(recorded_.count("b"), 1u);
  EXPECT_TRUE(recorded_["b"].empty());
}

}  // namespace
}  // namespace kiln::serving
