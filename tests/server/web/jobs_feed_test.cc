// The web page's jobs feed (server/web/jobs_feed.h) and its bound on event streams
// (server/web/long_answer_limit.h), without a server.
#include "server/web/jobs_feed.h"

#include <set>
#include <string>
#include <thread>

#include "engine/trainer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/web/long_answer_limit.h"

namespace kiln::web {
namespace {
using ::testing::ElementsAre;
using ::testing::IsEmpty;

v1::Job JobWithId(const std::string& id) {
  v1::Job job;
  job.set_id(id);
  return job;
}

TEST(JobsFeedTest, AListenerGetsEachChangedJobOnceHoweverOftenItChanged) {
  JobsFeed feed;
  std::shared_ptr<JobsFeed::Listener> listener = feed.Listen();
  for (int step = 0; step < 1000; ++step) feed.OnStep("job-a", {}, 32, 0.001);
  feed.OnSubmitted(JobWithId("job-b"));
  v1::Checkpoint checkpoint;
  checkpoint.set_job_id("job-c");
  feed.OnCheckpoint(checkpoint, 0.1);
  std::set<std::string> changed;
  ASSERT_TRUE(listener->WaitTake(&changed, absl::ZeroDuration()));
  EXPECT_THAT(changed, ElementsAre("job-a", "job-b", "job-c"));
  // Taken: nothing is left until the next change.
  changed.clear();
  EXPECT_FALSE(listener->WaitTake(&changed, absl::Milliseconds(1)));
  EXPECT_THAT(changed, IsEmpty());
}

TEST(JobsFeedTest, AWaitingListenerWakesOnAChangeAndAForgottenOneHearsNoMore) {
  JobsFeed feed;
  std::shared_ptr<JobsFeed::Listener> waiting = feed.Listen();
  std::shared_ptr<JobsFeed::Listener> forgotten = feed.Listen();
  feed.Forget(forgotten);
  std::thread changer([&] { feed.OnStateChanged(JobWithId("job-a"), v1::JOB_STATE_QUEUED); });
  std::set<std::string> changed;
  EXPECT_TRUE(waiting->WaitTake(&changed, absl::Seconds(60)));
  changer.join();
  EXPECT_THAT(changed, ElementsAre("job-a"));
  std::set<std::string> none;
  EXPECT_FALSE(forgotten->WaitTake(&none, absl::ZeroDuration()));
}

TEST(LongAnswerLimitTest, HandsOutAtMostItsSlotsAndTakesThemBack) {
  LongAnswerLimit limit(2);
  auto first = limit.Acquire();
  auto second = limit.Acquire();
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(limit.Acquire(), nullptr);
  EXPECT_EQ(limit.open_streams(), 2);
  first.reset();
  EXPECT_NE(limit.Acquire(), nullptr);  // given back again at once
  EXPECT_EQ(limit.open_streams(), 1);
}

TEST(LongAnswerLimitTest, StopRefusesNewStreamsAndWaitsForOpenOnesToEnd) {
  LongAnswerLimit limit(4);
  auto open = limit.Acquire();
  std::thread stream([&] {
    // A stream's turn: it sees stopping() and ends, giving its slot back.
    while (!limit.stopping()) std::this_thread::yield();
    open.reset();
  });
  limit.Stop(absl::Seconds(60));
  EXPECT_EQ(limit.open_streams(), 0);
  stream.join();
  EXPECT_EQ(limit.Acquire(), nullptr);
}

}  // namespace
}  // namespace kiln::web
