#include "server/jobs/metric_broadcaster.h"

#include "gtest/gtest.h"
#include "tests/support/status_matchers.h"

namespace kiln::server {
namespace {

v1::JobEvent Step(int64_t seq) {
  v1::JobEvent e;
  e.set_seq(seq);
  e.mutable_step()->set_global_step(seq);
  return e;
}

v1::JobEvent Epoch(int64_t seq, int epoch) {
  v1::JobEvent e;
  e.set_seq(seq);
  e.mutable_epoch()->set_epoch(epoch);
  return e;
}

TEST(MetricBroadcasterTest, EverySubscriberGetsEveryEventInOrder) {
  MetricBroadcaster b(16);
  auto s1 = b.Subscribe("j", true);
  auto s2 = b.Subscribe("j", false);
  b.Publish("j", Step(1));
  b.Publish("j", Epoch(2, 1));
  b.Publish("other", Epoch(3, 1));
  b.Close("j", absl::OkStatus());
  v1::JobEvent e;
  ASSERT_TRUE(s1->Pop(&e));
  EXPECT_EQ(e.seq(), 1);
  ASSERT_TRUE(s1->Pop(&e));
  EXPECT_EQ(e.seq(), 2);
  absl::Status status = absl::UnknownError("unset");
  EXPECT_TRUE(s1->Finished(&status));
  EXPECT_OK(status);
  ASSERT_TRUE(s2->Pop(&e)) << "steps are filtered, epochs are not";
  EXPECT_EQ(e.seq(), 2);
  EXPECT_FALSE(s2->Pop(&e));
}

TEST(MetricBroadcasterTest, AFullBufferDropsOldStepsFirstAndCountsThem) {
  MetricBroadcaster b(4);
  auto s = b.Subscribe("j", true);
  b.Publish("j", Epoch(1, 1));
  for (int i = 2; i <= 10; ++i) b.Publish("j", Step(i));  // never read: the publisher goes on
  b.Publish("j", Epoch(11, 2));
  std::vector<int64_t> seqs;
  int64_t dropped = 0;
  v1::JobEvent e;
  while (s->Pop(&e)) {
    seqs.push_back(e.seq());
    dropped += e.dropped_before();
  }
  EXPECT_EQ(seqs, (std::vector<int64_t>{1, 9, 10, 11}));
  EXPECT_EQ(dropped, 7);
  EXPECT_EQ(s->dropped_total(), 7);
}

TEST(MetricBroadcasterTest, NotifyRunsOnPublishAndNotAfterUnsubscribe) {
  MetricBroadcaster b(4);
  auto s = b.Subscribe("j", true);
  int calls = 0;
  s->SetNotify([&] { ++calls; });
  b.Publish("j", Step(1));
  EXPECT_EQ(calls, 1);
  b.Unsubscribe(s);
  b.Publish("j", Step(2));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(b.subscriber_count("j"), 0u);
}

}  // namespace
}  // namespace kiln::server
