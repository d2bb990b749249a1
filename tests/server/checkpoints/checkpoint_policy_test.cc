// The checkpoint policy's decisions: what a run writes after each epoch and on shutdown, and
// which checkpoints a new one makes redundant.
#include "server/checkpoints/checkpoint_policy.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln::server {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

v1::Checkpoint Made(int64_t id, v1::CheckpointKind kind) {
  v1::Checkpoint c;
  c.set_id(id);
  c.set_kind(kind);
  return c;
}

std::vector<int64_t> Ids(const std::vector<v1::Checkpoint>& checkpoints) {
  std::vector<int64_t> ids;
  for (const v1::Checkpoint& c : checkpoints) ids.push_back(c.id());
  return ids;
}

TEST(CheckpointPolicyTest, WritesPeriodicEveryNEpochsThenBestWhenImproved) {
  v1::CheckpointPolicy spec;
  spec.set_every_n_epochs(2);
  spec.set_keep_best(true);
  const CheckpointPolicy policy(spec);
  EXPECT_THAT(policy.AfterEpoch(1, /*improved=*/false), IsEmpty());
  EXPECT_THAT(policy.AfterEpoch(1, /*improved=*/true), ElementsAre(v1::CHECKPOINT_KIND_BEST));
  EXPECT_THAT(policy.AfterEpoch(2, /*improved=*/false), ElementsAre(v1::CHECKPOINT_KIND_PERIODIC));
  EXPECT_THAT(policy.AfterEpoch(4, /*improved=*/true),
              ElementsAre(v1::CHECKPOINT_KIND_PERIODIC, v1::CHECKPOINT_KIND_BEST));
}

TEST(CheckpointPolicyTest, AnEmptyPolicyWritesNothingPerEpochButOnShutdown) {
  const CheckpointPolicy policy{v1::CheckpointPolicy()};
  EXPECT_THAT(policy.AfterEpoch(1, /*improved=*/true), IsEmpty());
  EXPECT_TRUE(policy.OnShutdown());
  v1::CheckpointPolicy off;
  off.set_on_shutdown(false);
  EXPECT_FALSE(CheckpointPolicy(off).OnShutdown());
}

TEST(CheckpointPolicyTest, ANewBestMakesEveryOtherBestRedundant) {
  const CheckpointPolicy policy{v1::CheckpointPolicy()};
  const std::vector<v1::Checkpoint> existing = {
      Made(1, v1::CHECKPOINT_KIND_BEST), Made(2, v1::CHECKPOINT_KIND_PERIODIC),
      Made(3, v1::CHECKPOINT_KIND_BEST), Made(4, v1::CHECKPOINT_KIND_BEST)};
  EXPECT_THAT(Ids(policy.Redundant(existing, existing[3])), ElementsAre(1, 3));
}

TEST(CheckpointPolicyTest, ANewPeriodicPrunesTheOldestPeriodicBeyondKeepLast) {
  v1::CheckpointPolicy spec;
  spec.set_keep_last(2);
  const CheckpointPolicy policy(spec);
  const std::vector<v1::Checkpoint> existing = {
      Made(1, v1::CHECKPOINT_KIND_PERIODIC), Made(2, v1::CHECKPOINT_KIND_BEST),
      Made(3, v1::CHECKPOINT_KIND_PERIODIC), Made(4, v1::CHECKPOINT_KIND_ON_DEMAND),
      Made(5, v1::CHECKPOINT_KIND_PERIODIC)};
  EXPECT_THAT(Ids(policy.Redundant(existing, existing[4])), ElementsAre(1));
  EXPECT_THAT(Ids(policy.Redundant(existing, existing[3])), IsEmpty());  // on-demand prunes nothing
  EXPECT_THAT(Ids(CheckpointPolicy(v1::CheckpointPolicy()).Redundant(existing, existing[4])),
              IsEmpty());  // keep_last 0 keeps all
}

}  // namespace
}  // namespace kiln::server
