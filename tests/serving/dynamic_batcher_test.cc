// The dynamic batcher: concurrent requests run together and each caller gets exactly its own
// rows, whatever the batch they landed in, the input form, or how a large request was split.
#include "server/serving/dynamic_batcher.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/backend_registry.h"
#include "tests/serving/serving_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::serving {
namespace {

using testing::kClasses;
using testing::kPixels;

class DynamicBatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    images_ = testing::SampleImages(kImages, 7);
    auto backend = CreateBackend("cpu", {2});
    ASSERT_OK(backend);
    reference_backend_ = std::move(*backend);
    auto session = InferenceSession::FromCheckpoint(testing::SharedCheckpoints().mlp_flat,
                                                    reference_backend_.get(), 1);
    ASSERT_OK(session) << session.status();
    // Every image alone: what any batch must reproduce row by row.
    expected_probs_.resize(kImages * kClasses);
    expected_classes_.resize(kImages);
    for (int i = 0; i < kImages; ++i) {
      ASSERT_OK((*session)->PredictU8(images_.data() + i * kPixels, 1,
                                      expected_probs_.data() + i * kClasses,
                                      expected_classes_.data() + i));
    }
  }

  std::unique_ptr<DynamicBatcher> MakeBatcher(BatchingOptions options,
                                              std::function<void()> prepare_thread = nullptr,
                                              bool callers_run_when_idle = false) {
    auto backend = CreateBackend("cpu", {2});
    EXPECT_OK(backend);
    backends_.push_back(std::move(*backend));
    auto session = InferenceSession::FromCheckpoint(testing::SharedCheckpoints().mlp_flat,
                                                    backends_.back().get(), options.max_batch_size);
    EXPECT_OK(session) << session.status();
    auto batcher = DynamicBatcher::Create(std::move(*session), options, "model \"m\"",
                                          std::move(prepare_thread), callers_run_when_idle);
    EXPECT_OK(batcher) << batcher.status();
    return std::move(*batcher);
  }

  // Runs images [first, first + n) through `batcher` in `encoding` and checks every output row.
  void RunAndCheck(DynamicBatcher& batcher, int first, int n, PixelEncoding encoding) {
    std::vector<uint32_t> wide;
    std::vector<float> scaled;
    // One byte of offset: FP32 raw contents need not be aligned.
    std::vector<char> unaligned;
    PixelInput input;
    input.encoding = encoding;
    input.samples = n;
    const uint8_t* pixels = images_.data() + first * kPixels;
    if (encoding == PixelEncoding::kU8) {
      input.data = pixels;
    } else if (encoding == PixelEncoding::kU32) {
      wide.assign(pixels, pixels + n * kPixels);
      input.data = wide.data();
    } else {
      scaled.resize(n * kPixels);
      for (int i = 0; i < n * kPixels; ++i) scaled[i] = pixels[i] / 255.0f;
      unaligned.resize(scaled.size() * sizeof(float) + 1);
      std::memcpy(unaligned.data() + 1, scaled.data(), scaled.size() * sizeof(float));
      input.data = unaligned.data() + 1;
    }
    std::vector<float> probs(n * kClasses, -1);
    std::vector<int64_t> classes(n, -1);
    OutputBuffers out{reinterpret_cast<char*>(probs.data()),
                      reinterpret_cast<char*>(classes.data())};
    absl::Status status = batcher.Run(input, out);
    ASSERT_OK(status) << status;
    // FP32 inputs go through x * 255 before the normalisation: equal to float rounding.
    const float tolerance = encoding == PixelEncoding::kF32 ? 1e-5f : 1e-6f;
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(classes[i], expected_classes_[first + i]) << "image " << first + i;
      for (int c = 0; c < kClasses; ++c) {
        EXPECT_NEAR(probs[i * kClasses + c], expected_probs_[(first + i) * kClasses + c],
                    tolerance);
      }
    }
  }

  static constexpr int kImages = 64;
  std::vector<uint8_t> images_;
  std::unique_ptr<Backend> reference_backend_;
  std::vector<float> expected_probs_;
  std::vector<int32_t> expected_classes_;
  std::vector<std::unique_ptr<Backend>> backends_;  // outlive the batchers made from them
};

TEST_F(DynamicBatcherTest, BatchingOffRunsEverySampleAlone) {
  auto batcher = MakeBatcher({1, 500});
  RunAndCheck(*batcher, 0, 5, PixelEncoding::kU8);
  EXPECT_EQ(batcher->stats().batches, 5);
  EXPECT_EQ(batcher->stats().samples, 5);
  EXPECT_EQ(batcher->stats().requests, 1);
}

TEST_F(DynamicBatcherTest, RequestsLargerThanMaxBatchAreSplitAcrossPasses) {
  auto batcher = MakeBatcher({4, 0});
  RunAndCheck(*batcher, 3, 10, PixelEncoding::kU8);
  EXPECT_EQ(batcher->stats().batches, 3);  // 4 + 4 + 2
  RunAndCheck(*batcher, 20, 9, PixelEncoding::kF32);
  EXPECT_EQ(batcher->stats().batches, 6);
}

TEST_F(DynamicBatcherTest, ConcurrentRequestsRunTogether) {
  // A long delay, so the 16 requests surely meet in the queue.
  auto batcher = MakeBatcher({64, 200000});
  std::vector<std::thread> clients;
  for (int i = 0; i < 16; ++i) {
    clients.emplace_back([&, i] { RunAndCheck(*batcher, i, 1, PixelEncoding::kU8); });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(batcher->stats().requests, 16);
  EXPECT_LT(batcher->stats().batches, 16);
}

TEST_F(DynamicBatcherTest, MixedInputFormsAndSizesShareBatches) {
  auto batcher = MakeBatcher({16, 2000});
  const PixelEncoding encodings[] = {PixelEncoding::kU8, PixelEncoding::kU32, PixelEncoding::kF32};
  std::vector<std::thread> clients;
  for (int i = 0; i < 12; ++i) {
    clients.emplace_back([&, i] {
      for (int round = 0; round < 20; ++round) {
        const int n = 1 + (i + round) % 5;  // 1..5 samples, some requests straddle batches
        RunAndCheck(*batcher, (i * 5 + round) % (kImages - n), n, encodings[(i + round) % 3]);
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(batcher->stats().requests, 12 * 20);
}

TEST_F(DynamicBatcherTest, ZeroDelayStillAnswersEveryRequest) {
  auto batcher = MakeBatcher({64, 0});
  std::vector<std::thread> clients;
  for (int i = 0; i < 8; ++i) {
    clients.emplace_back([&, i] {
      for (int round = 0; round < 50; ++round) {
        RunAndCheck(*batcher, (i + round) % kImages, 1, PixelEncoding::kU8);
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(batcher->stats().requests, 400);
  EXPECT_EQ(batcher->stats().samples, 400);
}

// Records the threads the batcher prepared for driving the session.
class ThreadLog {
 public:
  std::function<void()> Hook() {
    return [this] {
      std::lock_guard<std::mutex> lock(mu_);
      ids_.push_back(std::this_thread::get_id());
    };
  }
  bool Saw(std::thread::id id) {
    std::lock_guard<std::mutex> lock(mu_);
    return std::find(ids_.begin(), ids_.end(), id) != ids_.end();
  }

 private:
  std::mutex mu_;
  std::vector<std::thread::id> ids_;
};

TEST_F(DynamicBatcherTest, AnIdleRequestRunsOnItsCallerWhenAllowed) {
  ThreadLog log;
  auto batcher = MakeBatcher({1, 500}, log.Hook(), /*callers_run_when_idle=*/true);
  RunAndCheck(*batcher, 0, 3, PixelEncoding::kU8);
  EXPECT_TRUE(log.Saw(std::this_thread::get_id())) << "the caller did not run its own request";
  EXPECT_EQ(batcher->stats().batches, 3);
  EXPECT_EQ(batcher->stats().requests, 1);
}

TEST_F(DynamicBatcherTest, ARequestThatWillBeWaitedForStaysWithTheWorker) {
  ThreadLog log;
  // Batching on with a delay: the delay is what the deployment asked for, so no caller runs.
  auto batcher = MakeBatcher({8, 1000}, log.Hook(), /*callers_run_when_idle=*/true);
  RunAndCheck(*batcher, 0, 1, PixelEncoding::kU8);
  EXPECT_FALSE(log.Saw(std::this_thread::get_id()));
}

TEST_F(DynamicBatcherTest, CallersAndTheWorkerShareTheSessionWithoutMixingAnswers) {
  for (BatchingOptions options : {BatchingOptions{1, 0}, BatchingOptions{4, 0}}) {
    SCOPED_TRACE(options.max_batch_size);
    ThreadLog log;
    auto batcher = MakeBatcher(options, log.Hook(), /*callers_run_when_idle=*/true);
    const PixelEncoding encodings[] = {PixelEncoding::kU8, PixelEncoding::kU32,
                                       PixelEncoding::kF32};
    std::vector<std::thread> clients;
    for (int i = 0; i < 8; ++i) {
      clients.emplace_back([&, i] {
        for (int round = 0; round < 40; ++round) {
          const int n = 1 + (i + round) % 6;  // some requests span several passes
          RunAndCheck(*batcher, (i * 7 + round) % (kImages - n), n, encodings[(i + round) % 3]);
        }
      });
    }
    for (auto& t : clients) t.join();
    EXPECT_EQ(batcher->stats().requests, 8 * 40);
  }
}

// A worker held busy (here: before its first batch) leaves requests queued; they count until
// they run, and a request run on its caller never counts.
TEST_F(DynamicBatcherTest, QueuedRequestsCountsRequestsWaitingForABatch) {
  std::mutex mu;
  std::condition_variable cv;
  bool released = false;
  auto hold = [&] {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return released; });
  };
  auto batcher = MakeBatcher({4, 0}, hold);
  EXPECT_EQ(batcher->queued_requests(), 0);
  std::vector<std::thread> clients;
  for (int i = 0; i < 6; ++i) {
    clients.emplace_back([&, i] { RunAndCheck(*batcher, i * 2, 2, PixelEncoding::kU8); });
  }
  bool saw_six = false;
  for (int i = 0; i < 1000 && !saw_six; ++i) {
    saw_six = batcher->queued_requests() == 6;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_TRUE(saw_six) << "queued: " << batcher->queued_requests();
  {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
  }
  cv.notify_all();
  for (auto& t : clients) t.join();
  EXPECT_EQ(batcher->queued_requests(), 0);
  EXPECT_EQ(batcher->stats().requests, 6);

  auto idle = MakeBatcher({1, 0}, nullptr, /*callers_run_when_idle=*/true);
  RunAndCheck(*idle, 0, 1, PixelEncoding::kU8);
  EXPECT_EQ(idle->queued_requests(), 0);
}

TEST_F(DynamicBatcherTest, BadOptionsAreRefused) {
  auto backend = CreateBackend("cpu", {1});
  ASSERT_OK(backend);
  auto make = [&](int session_batch, BatchingOptions options) {
    auto session = InferenceSession::FromCheckpoint(testing::SharedCheckpoints().mlp_flat,
                                                    backend->get(), session_batch);
    EXPECT_OK(session);
    return DynamicBatcher::Create(std::move(*session), options, "model \"m\"").status();
  };
  EXPECT_NE(make(4, {0, 10}).message().find("max_batch_size must be at least 1"),
            std::string::npos);
  EXPECT_NE(make(4, {4, -1}).message().find("max_queue_delay_us must be at least 0"),
            std::string::npos);
  EXPECT_NE(make(4, {8, 10}).message().find("less than max_batch_size 8"), std::string::npos);
}

}  // namespace
}  // namespace kiln::serving
