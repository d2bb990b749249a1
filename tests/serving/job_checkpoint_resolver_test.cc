// kilnd's model sources: JOB, JOB@latest, JOB@best and JOB@ID pick the right checkpoint, label
// the version with its id and give it the aliases it holds.
#include "server/serving/job_checkpoint_resolver.h"

#include <gtest/gtest.h>

#include "tests/support/status_matchers.h"

namespace kiln::serving {
namespace {

v1::Checkpoint MakeCheckpoint(int64_t id, double accuracy) {
  v1::Checkpoint c;
  c.set_id(id);
  c.set_job_id("job1");
  c.set_test_accuracy(accuracy);
  c.set_path("/state/job1/" + std::to_string(id) + ".safetensors");
  return c;
}

CheckpointResolver Resolver() {
  return MakeJobCheckpointResolver(
      [](const std::string& job) -> absl::StatusOr<std::vector<v1::Checkpoint>> {
        if (job == "job1") {
          return std::vector<v1::Checkpoint>{MakeCheckpoint(3, 0.91), MakeCheckpoint(5, 0.97),
                                             MakeCheckpoint(8, 0.95)};
        }
        if (job == "empty") return std::vector<v1::Checkpoint>{};
        return absl::NotFoundError("unknown job " + job);
      });
}

TEST(JobCheckpointResolverTest, LatestBestAndIdsPickTheirCheckpoint) {
  const CheckpointResolver resolve = Resolver();
  for (const std::string source : {"job1", "job1@latest"}) {
    auto r = resolve(source);
    ASSERT_OK(r) << r.status();
    EXPECT_EQ(r->path, "/state/job1/8.safetensors");
    EXPECT_EQ(r->pinned_source, "job1@8");
    EXPECT_EQ(r->aliases, std::vector<std::string>({"latest"}));
  }
  auto best = resolve("job1@best");
  ASSERT_OK(best);
  EXPECT_EQ(best->pinned_source, "job1@5");
  EXPECT_EQ(best->aliases, std::vector<std::string>({"best"}));
  auto by_id = resolve("job1@3");
  ASSERT_OK(by_id);
  EXPECT_EQ(by_id->path, "/state/job1/3.safetensors");
  EXPECT_TRUE(by_id->aliases.empty());
}

TEST(JobCheckpointResolverTest, BadSourcesAreNamed) {
  const CheckpointResolver resolve = Resolver();
  struct Case {
    std::string source;
    absl::StatusCode code;
    std::string fragment;
  } cases[] = {
      {"@best", absl::StatusCode::kInvalidArgument, "names no job"},
      {"job1@worst", absl::StatusCode::kInvalidArgument, "not \"worst\""},
      {"job1@-2", absl::StatusCode::kInvalidArgument, "not \"-2\""},
      {"job1@4", absl::StatusCode::kNotFound, "job job1 has no checkpoint 4"},
      {"empty@best", absl::StatusCode::kNotFound, "job empty has no checkpoints"},
      {"nope", absl::StatusCode::kNotFound, "unknown job nope"},
  };
  for (const Case& c : cases) {
    auto r = resolve(c.source);
    EXPECT_EQ(r.status().code(), c.code) << c.source;
    EXPECT_NE(r.status().message().find(c.fragment), std::string::npos) << r.status();
  }
}

}  // namespace
}  // namespace kiln::serving
