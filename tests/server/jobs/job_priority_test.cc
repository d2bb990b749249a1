// Who goes first, through the job manager: a device's queue starts by priority, then the team
// with fewer running jobs, then submission; a team at its quota waits without holding up other
// teams; and a high-priority job preempts a lower one, which checkpoints, waits its turn and
// resumes to the bits an uninterrupted run reaches.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/jobs/job_manager_fixture.h"

namespace kiln::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::JobManagerTest;
using testing::kEndless;
using testing::kWait;
using testing::SmallSpec;

v1::JobSpec WithPriority(v1::JobSpec spec, v1::Priority priority) {
  spec.set_priority(priority);
  return spec;
}

v1::Owner OwnerOf(const std::string& user, const std::string& team) {
  v1::Owner owner;
  owner.set_user(user);
  owner.set_team(team);
  return owner;
}

class JobPriorityTest : public JobManagerTest {
 protected:
  void CancelAndWait(const std::string& id) {
    ASSERT_OK(manager_->Cancel(id));
    ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_CANCELLED));
  }
};

TEST_F(JobPriorityTest, TheQueueStartsByPriorityThenInOrderOfSubmission) {
  JobManagerOptions slow = Options();
  slow.step_delay = absl::Milliseconds(20);
  StartManager(slow);
  // A high job holds the one slot: no one preempts it, so the others queue behind it.
  const std::string blocker =
      SubmitOrDie(WithPriority(SmallSpec("toy", kEndless), v1::PRIORITY_HIGH));
  ASSERT_TRUE(WaitForState(blocker, v1::JOB_STATE_RUNNING));
  const std::string n1 = SubmitOrDie(SmallSpec("toy", 1));
  const std::string l1 = SubmitOrDie(WithPriority(SmallSpec("toy", 1), v1::PRIORITY_LOW));
  const std::string h1 = SubmitOrDie(WithPriority(SmallSpec("toy", 1), v1::PRIORITY_HIGH));
  const std::string n2 = SubmitOrDie(WithPriority(SmallSpec("toy", 1), v1::PRIORITY_NORMAL));
  CancelAndWait(blocker);
  for (const std::string& id : {n1, l1, h1, n2}) {
    ASSERT_TRUE(WaitForState(id, v1::JOB_STATE_SUCCEEDED)) << id;
  }
  EXPECT_THAT(observer_.Started(), ElementsAre(blocker, h1, n1, n2, l1));
}

TEST_F(JobPriorityTest, ATeamWithFewerRunningJobsGoesBeforeOneWithMany) {
  JobManagerOptions two = Options();
  two.max_jobs_per_device = 2;
  two.step_delay = absl::Milliseconds(20);
  StartManager(two);
  const std::string alice_running = SubmitOrDie(SmallSpec("toy", kEndless), OwnerOf("alice", "a"));
  const std::string bob_running = SubmitOrDie(SmallSpec("toy", kEndless), OwnerOf("bob", "b"));
  ASSERT_TRUE(WaitForState(alice_running, v1::JOB_STATE_RUNNING));
  ASSERT_TRUE(WaitForState(bob_running, v1::JOB_STATE_RUNNING));
  // Alice's sweep queues first; Bob's one job comes after it.
  const std::string a1 = SubmitOrDie(SmallSpec("toy", kEndless), OwnerOf("alice", "a"));
  const std::string a2 = SubmitOrDie(SmallSpec("toy", kEndless), OwnerOf("alice", "a"));
  const std::string b1 = SubmitOrDie(SmallSpec("toy", kEndless), OwnerOf("bob", "b"));
  // Bob's slot frees: his team runs none now, Alice's one, so his job goes first.
  CancelAndWait(bob_running);
  ASSERT_TRUE(WaitForState(b1, v1::JOB_STATE_RUNNING));
  v1::Job waiting;
  ASSERT_OK(manager_->Get(a1).status());
  EXPECT_EQ(manager_->Get(a1)->state(), v1::JOB_STATE_QUEUED);
  CancelAndWait(alice_running);
  ASSERT_TRUE(WaitForState(a1, v1::JOB_STATE_RUNNING));
  EXPECT_EQ(manager_->Get(a2)->state(), v1::JOB_STATE_QUEUED);
  for (const std::string& id : {a1, a2, b1}) ASSERT_OK(manager_->Cancel(id));
}

TEST_F(JobPriorityTest, ATeamAtItsQuotaWaitsSayingSoWithoutHoldingUpOtherTeams) {
  JobManagerOptions options = Options();
  options.max_jobs_per_device = 3;
  options.team_quota.max_running_jobs = 1;
  options.step_delay = absl::Milliseconds(20);
  StartManager(options);
  const std::string a1 = SubmitOrDie(SmallSpec("toy", kEndless), OwnerOf("alice", "a"));
  ASSERT_TRUE(WaitForState(a1, v1::JOB_STATE_RUNNING));
  const std::string a2 = SubmitOrDie(SmallSpec("toy", kEndless), OwnerOf("alice", "a"));
  const std::string b1 = SubmitOrDie(SmallSpec("toy", kEndless), OwnerOf("bob", "b"));
  ASSERT_TRUE(WaitForState(b1, v1::JOB_STATE_RUNNING));
  v1::Job held = *manager_->Get(a2);
  EXPECT_EQ(held.state(), v1::JOB_STATE_QUEUED);
  EXPECT_THAT(held.reason(), HasSubstr("team a runs 1 jobs, its quota"));
  CancelAndWait(a1);
  ASSERT_TRUE(WaitForState(a2, v1::JOB_STATE_RUNNING));
  for (const std::string& id : {a2, b1}) ASSERT_OK(manager_->Cancel(id));
}

TEST_F(JobPriorityTest, AHighJobPreemptsALowOneWhichResumesToTheBitsOfAnUninterruptedRun) {
  // The reference: the low job's spec trained without interruption.
  StartManager(Options());
  const v1::JobSpec low_spec = WithPriority(SmallSpec("toy", 3), v1::PRIORITY_LOW);
  const std::string reference = SubmitOrDie(low_spec);
  v1::Job uninterrupted;
  ASSERT_TRUE(WaitForState(reference, v1::JOB_STATE_SUCCEEDED, &uninterrupted));

  JobManagerOptions slow = Options();
  slow.step_delay = absl::Milliseconds(50);  // 24 steps: over a second to preempt it mid-way
  StartManager(slow);
  const std::string low = SubmitOrDie(low_spec);
  ASSERT_TRUE(WaitForSteps(low, 3));
  // Another low job, submitted after it: the preempted one keeps its place ahead of this one.
  const std::string later = SubmitOrDie(WithPriority(SmallSpec("toy", 1), v1::PRIORITY_LOW));
  const std::string high = SubmitOrDie(WithPriority(SmallSpec("toy", 1), v1::PRIORITY_HIGH));
  v1::Job preempted;
  ASSERT_TRUE(WaitForState(high, v1::JOB_STATE_RUNNING));
  ASSERT_OK(manager_->Get(low).status());
  preempted = *manager_->Get(low);
  EXPECT_EQ(preempted.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(preempted.reason(), "preempted by " + high);
  std::vector<v1::Checkpoint> checkpoints = CheckpointsOf(low);
  ASSERT_FALSE(checkpoints.empty());
  EXPECT_EQ(checkpoints.back().kind(), v1::CHECKPOINT_KIND_PREEMPTED);
  EXPECT_GE(checkpoints.back().global_step(), 3);

  v1::Job resumed;
  ASSERT_TRUE(WaitForState(high, v1::JOB_STATE_SUCCEEDED));
  ASSERT_TRUE(WaitForState(low, v1::JOB_STATE_SUCCEEDED, &resumed));
  EXPECT_EQ(resumed.attempts(), 2);
  EXPECT_EQ(resumed.resumed_from_step(), checkpoints.back().global_step());
  EXPECT_EQ(resumed.global_step(), uninterrupted.global_step());
  // The same bits: the last epoch's losses and accuracies, to the last digit.
  EXPECT_EQ(resumed.last_epoch().train_loss(), uninterrupted.last_epoch().train_loss());
  EXPECT_EQ(resumed.last_epoch().test_loss(), uninterrupted.last_epoch().test_loss());
  EXPECT_EQ(resumed.last_epoch().test_accuracy(), uninterrupted.last_epoch().test_accuracy());
  ASSERT_TRUE(WaitForState(later, v1::JOB_STATE_SUCCEEDED));
  EXPECT_THAT(observer_.Started(), ElementsAre(reference, low, high, low, later));
  EXPECT_THAT(observer_.States(low), ElementsAre("state JOB_STATE_UNSPECIFIED->JOB_STATE_QUEUED",
                                                 "state JOB_STATE_QUEUED->JOB_STATE_RUNNING",
                                                 "state JOB_STATE_RUNNING->JOB_STATE_QUEUED",
                                                 "state JOB_STATE_QUEUED->JOB_STATE_RUNNING",
                                                 "state JOB_STATE_RUNNING->JOB_STATE_SUCCEEDED"));
}

TEST_F(JobPriorityTest, ANonPreemptibleJobKeepsItsSlot) {
  JobManagerOptions slow = Options();
  slow.step_delay = absl::Milliseconds(20);
  StartManager(slow);
  v1::JobSpec pinned = WithPriority(SmallSpec("toy", kEndless), v1::PRIORITY_LOW);
  pinned.set_non_preemptible(true);
  const std::string low = SubmitOrDie(pinned);
  ASSERT_TRUE(WaitForState(low, v1::JOB_STATE_RUNNING));
  const int64_t before = manager_->Get(low)->global_step();
  const std::string high = SubmitOrDie(WithPriority(SmallSpec("toy", 1), v1::PRIORITY_HIGH));
  ASSERT_TRUE(WaitForSteps(low, before + 10));
  EXPECT_EQ(manager_->Get(low)->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(manager_->Get(high)->state(), v1::JOB_STATE_QUEUED);
  CancelAndWait(low);
  ASSERT_TRUE(WaitForState(high, v1::JOB_STATE_SUCCEEDED));
}

TEST_F(JobPriorityTest, AnUnknownPriorityIsRefusedNamingTheField) {
  StartManager(Options());
  v1::JobSpec spec = SmallSpec("toy", 1);
  spec.set_priority(static_cast<v1::Priority>(9));
  absl::StatusOr<v1::Job> job = manager_->Submit(spec);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("spec.priority: unknown priority 9"));
}

}  // namespace
}  // namespace kiln::server
