// The rules of who goes first, alone: the order a queue starts in, the team quota, and which
// running job a waiting one preempts.
#include "server/scheduling/queue_order.h"

#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> Ids(const std::vector<QueuedJob>& queue,
                             const std::map<std::string, TeamUsage>& usage) {
  std::vector<std::string> ids;
  for (size_t i : StartOrder(queue, usage)) ids.push_back(queue[i].id);
  return ids;
}

TEST(StartOrderTest, HigherPriorityFirstAndQueueOrderWithinOne) {
  const std::vector<QueuedJob> queue = {{"n1", v1::PRIORITY_NORMAL, "a"},
                                        {"l1", v1::PRIORITY_LOW, "a"},
                                        {"h1", v1::PRIORITY_HIGH, "a"},
                                        {"u1", v1::PRIORITY_UNSPECIFIED, "a"},  // normal
                                        {"h2", v1::PRIORITY_HIGH, "a"}};
  EXPECT_THAT(Ids(queue, {}), ElementsAre("h1", "h2", "n1", "u1", "l1"));
}

TEST(StartOrderTest, WithinAPriorityTheTeamRunningFewerJobsGoesFirst) {
  // Alice's sweep queued first; Bob's one job still goes before the rest of it while her team
  // runs more than his.
  const std::vector<QueuedJob> queue = {{"a1", v1::PRIORITY_NORMAL, "alice"},
                                        {"a2", v1::PRIORITY_NORMAL, "alice"},
                                        {"b1", v1::PRIORITY_NORMAL, "bob"},
                                        {"x1", v1::PRIORITY_LOW, "bob"}};
  std::map<std::string, TeamUsage> usage;
  usage["alice"].running_jobs = 2;
  usage["bob"].running_jobs = 1;
  EXPECT_THAT(Ids(queue, usage), ElementsAre("b1", "a1", "a2", "x1"));
  usage["bob"].running_jobs = 2;  // equal: queue order
  EXPECT_THAT(Ids(queue, usage), ElementsAre("a1", "a2", "b1", "x1"));
}

TEST(QuotaBlockTest, ATeamAtItsQuotaWaitsAndJobsOfNoTeamAreNotLimited) {
  const TeamQuota quota{2, 4};
  EXPECT_EQ(QuotaBlock("vision", {1, 0}, 0, quota), "");
  EXPECT_THAT(QuotaBlock("vision", {2, 0}, 0, quota),
              HasSubstr("team vision runs 2 jobs, its quota (--team_max_running_jobs)"));
  EXPECT_EQ(QuotaBlock("vision", {1, 2}, 2, quota), "");
  EXPECT_THAT(QuotaBlock("vision", {1, 3}, 2, quota),
              HasSubstr("holds 3 GPUs and this job needs 2 more; its quota is 4"));
  EXPECT_EQ(QuotaBlock("", {9, 9}, 9, quota), "");
  EXPECT_EQ(QuotaBlock("vision", {9, 9}, 9, TeamQuota{}), "") << "0: no limit";
}

TEST(ChoosePreemptionTest, TheLowestPriorityBelowTheWaitingJobTheLatestStartedAmongEquals) {
  const std::vector<RunningJob> running = {
      {"low-old", v1::PRIORITY_LOW, true, false, 100, {"cpu"}},
      {"low-new", v1::PRIORITY_LOW, true, false, 200, {"cpu"}},
      {"normal", v1::PRIORITY_NORMAL, true, false, 300, {"cpu"}},
      {"low-gpu", v1::PRIORITY_LOW, true, false, 400, {"cuda:0"}}};
  std::string victim;
  ASSERT_TRUE(ChoosePreemption(v1::PRIORITY_HIGH, "cpu", running, &victim));
  EXPECT_EQ(victim, "low-new");
  ASSERT_TRUE(ChoosePreemption(v1::PRIORITY_NORMAL, "cpu", running, &victim));
  EXPECT_EQ(victim, "low-new");
  ASSERT_TRUE(ChoosePreemption(v1::PRIORITY_HIGH, "cuda:0", running, &victim));
  EXPECT_EQ(victim, "low-gpu");
  EXPECT_FALSE(ChoosePreemption(v1::PRIORITY_LOW, "cpu", running, &victim)) << "none below low";
  EXPECT_FALSE(ChoosePreemption(v1::PRIORITY_HIGH, "cuda:1", running, &victim));
}

TEST(ChoosePreemptionTest, NonPreemptibleJobsStayAndAStoppingOneIsWaitedFor) {
  std::vector<RunningJob> running = {{"pinned", v1::PRIORITY_LOW, false, false, 100, {"cpu"}}};
  std::string victim;
  EXPECT_FALSE(ChoosePreemption(v1::PRIORITY_HIGH, "cpu", running, &victim));
  running.push_back({"going", v1::PRIORITY_NORMAL, true, true, 200, {"cpu"}});
  running.push_back({"low", v1::PRIORITY_LOW, true, false, 300, {"cpu"}});
  ASSERT_TRUE(ChoosePreemption(v1::PRIORITY_HIGH, "cpu", running, &victim));
  EXPECT_EQ(victim, "") << "one stopping already frees a slot: no second preemption";
}

TEST(PriorityNameTest, WordsRoundTrip) {
  for (v1::Priority p : {v1::PRIORITY_LOW, v1::PRIORITY_NORMAL, v1::PRIORITY_HIGH}) {
    EXPECT_EQ(PriorityNamed(PriorityName(p)), p);
  }
  EXPECT_STREQ(PriorityName(v1::PRIORITY_UNSPECIFIED), "normal");
  EXPECT_FALSE(PriorityNamed("urgent").has_value());
}

}  // namespace
}  // namespace kiln::server
