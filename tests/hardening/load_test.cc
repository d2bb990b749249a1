// kilnd under load on loopback: 64 concurrent ModelInfer clients and 16 WatchJob subscribers for
// KILN_LOAD_TEST_SECONDS (default 60) while a job trains. Asserted: no request fails, every
// subscriber gets the job's whole ordered stream ending with its end, and kilnd's resident
// memory stays flat. Measured and printed (for bench/RESULTS.md): training steps/s with and
// without the load, and the request rate and latency.
//
// The machine may have as few as 2 cores, shared by training, serving and these clients, so the
// clients pace themselves (one request, then a pause) rather than hammer, and kilnd runs with
// --max_jobs_per_device=2: a CPU job then takes half the cores (server/jobs/job_manager.cc), which
// leaves the other half to serving (one thread per deployment) and the clients. A job with every
// core has its OpenMP team stall at each barrier whenever another thread takes one of them.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "hardening_test_support.h"
#include "inference/grpc_service.grpc.pb.h"
#include "server_test_support.h"
#include "serving_test_support.h"
#include "tests/support/connected_channel.h"
#include "tests/support/status_matchers.h"

namespace kiln::server {
namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using testing::GetJob;
using testing::WaitFor;
using testing::WaitForState;

constexpr int kClients = 64;
constexpr int kWatchers = 16;
// Each client sends one single-image request, waits for the answer, then pauses this long: up
// to 64 / 50 ms = 1280 requests/s in all.
constexpr auto kClientPause = std::chrono::milliseconds(50);
constexpr int kJobsPerDevice = 2;
// 8192 samples in batches of 128 (the mnist-mlp preset): 64 steps an epoch.
constexpr int kTrainSamples = 8192;
constexpr int kStepsPerEpoch = kTrainSamples / 128;
constexpr int kBaselineEpochs = 4;
// Resident memory may rise by this much from the first to the last window of the load. kilnd
// reaches its steady state within the first seconds (gRPC's per-connection buffers, malloc's
// per-thread arenas, SQLite's page cache, the subscribers' bounded event buffers); after that,
// single samples swing by up to about 3.5 MiB (transient buffers). Between the windows of a 60 s
// run come about 48,000 requests and 80,000 streamed events, so a leak of 200 bytes a request
// or 120 bytes an event exceeds this.
constexpr int64_t kRssToleranceBytes = int64_t{8} << 20;

int LoadSeconds() {
  const char* env = std::getenv("KILN_LOAD_TEST_SECONDS");
  int seconds = 60;
  if (env != nullptr && (!absl::SimpleAtoi(env, &seconds) || seconds < 3)) {
    ADD_FAILURE() << "KILN_LOAD_TEST_SECONDS=" << env << ": expected a number of seconds >= 3";
    seconds = 60;
  }
  return seconds;
}

constexpr double kForever = std::numeric_limits<double>::infinity();

double Seconds(const google::protobuf::Timestamp& t) { return t.seconds() + t.nanos() * 1e-9; }

// Training speed of a finished job from its epoch events: steps over the trainer's own epoch
// times, for epochs after the first (warm-up) whose end event came at or before `until` (Unix
// seconds), and after `from`.
struct TrainingRate {
  double steps_per_sec = 0;
  int epochs = 0;
};
TrainingRate RateOf(const std::vector<v1::JobEvent>& events, double from, double until) {
  double seconds = 0;
  TrainingRate rate;
  for (const v1::JobEvent& e : events) {
    if (!e.has_epoch() || e.epoch().epoch() == 1) continue;
    const double end = Seconds(e.time());
    if (end > until || end - e.epoch().train_seconds() < from) continue;
    seconds += e.epoch().train_seconds();
    ++rate.epochs;
  }
  if (seconds > 0) rate.steps_per_sec = rate.epochs * kStepsPerEpoch / seconds;
  return rate;
}

// One subscriber: WatchJob with steps from the start, read to the end.
struct Watcher {
  std::thread thread;
  testing::WatchResult result;
};

// One client's tally.
struct ClientTally {
  int64_t ok = 0, failed = 0;
  std::string first_error;
  std::vector<double> latencies_us;
};

std::unique_ptr<inference::GRPCInferenceService::Stub> InferenceStub(int port) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a TCP connection per client
  return inference::GRPCInferenceService::NewStub(
      kiln::testing::ConnectedChannel(absl::StrCat("127.0.0.1:", port), args));
}

// Checks one subscriber's stream: OK, starting at the job's first event, every seq in order
// with gaps only where dropped_before says events were dropped, every epoch done once in order,
// and the job's end (cancelled, when the load ended) last.
void ExpectCompleteStream(const testing::WatchResult& w, int epochs, int index) {
  SCOPED_TRACE(absl::StrCat("subscriber ", index));
  ASSERT_OK(w.status) << w.status.error_message();
  ASSERT_FALSE(w.events.empty());
  EXPECT_EQ(w.events.front().seq(), 1);
  int64_t dropped = 0, out_of_order = 0;
  std::vector<int> epoch_numbers;
  for (size_t i = 0; i < w.events.size(); ++i) {
    const v1::JobEvent& e = w.events[i];
    dropped += e.dropped_before();
    if (i > 0 && e.seq() != w.events[i - 1].seq() + 1 + e.dropped_before()) ++out_of_order;
    if (e.has_epoch()) epoch_numbers.push_back(e.epoch().epoch());
  }
  EXPECT_EQ(out_of_order, 0) << "seq gaps not accounted for by dropped_before";
  std::vector<int> expected(epochs);
  for (int i = 0; i < epochs; ++i) expected[i] = i + 1;
  EXPECT_EQ(epoch_numbers, expected);
  EXPECT_EQ(w.events.back().state().state(), v1::JOB_STATE_CANCELLED);
  if (dropped > 0)
    std::printf("[ load     ] subscriber %d: %lld step events dropped\n", index,
                static_cast<long long>(dropped));
}

// The 1-minute load average of the machine (other work on it shows here), from /proc/loadavg.
std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one_minute;
  in >> one_minute;
  return one_minute;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

class LoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::MakeTempDir("kilnd-load");
    testing::WriteToyDataset(root_ + "/data/toy", kTrainSamples, 1024);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  v1::JobSpec Spec(int epochs) {
    v1::JobSpec spec;
    spec.set_preset("mnist-mlp");
    spec.set_dataset("toy");
    spec.set_device("cpu");
    spec.set_epochs(epochs);
    spec.set_seed(3);
    return spec;
  }

  // Runs a job without load; its events.
  std::vector<v1::JobEvent> RunUnloaded(v1::Training::Stub& stub, int epochs, std::string* id) {
    *id = testing::SubmitJob(stub, Spec(epochs));
    EXPECT_TRUE(WaitForState(stub, *id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(300)));
    return testing::WatchToEnd(stub, *id).events;
  }

  std::string root_;
};

TEST_F(LoadTest, InferenceAndWatchersDoNotFailOrLeakWhileAJobTrains) {
  const int load_seconds = LoadSeconds();
  testing::KilndProcess kilnd(
      root_ + "/state", root_ + "/data",
      {"--metrics_listen=", absl::StrCat("--max_jobs_per_device=", kJobsPerDevice)});
  ASSERT_TRUE(kilnd.Start());
  auto stub = kilnd.NewStub();

  // Training speed without load; the job's checkpoint becomes the served model.
  std::string baseline_id;
  const std::vector<v1::JobEvent> baseline_events =
      RunUnloaded(*stub, kBaselineEpochs, &baseline_id);
  const TrainingRate baseline_before = RateOf(baseline_events, 0, kForever);
  ASSERT_GT(baseline_before.epochs, 0);
  auto admin = InferenceStub(kilnd.port());
  {
    grpc::ClientContext context;
    inference::RepositoryModelLoadRequest request;
    request.set_model_name("digits");
    (*request.mutable_parameters())["checkpoint"].set_string_param(baseline_id + "@latest");
    inference::RepositoryModelLoadResponse response;
    grpc::Status status = admin->RepositoryModelLoad(&context, request, &response);
    ASSERT_OK(status) << status.error_message();
  }

  // The loaded job would run three times as long as the load without it; it is cancelled when
  // the load ends, so its end comes right after the load whatever the machine's speed.
  const int epochs = static_cast<int>(
      std::ceil(3.0 * load_seconds * baseline_before.steps_per_sec / kStepsPerEpoch));
  const std::string id = testing::SubmitJob(*stub, Spec(epochs));
  std::vector<Watcher> watchers(kWatchers);
  for (Watcher& w : watchers) {
    w.thread = std::thread([&w, &kilnd, &id] {
      auto own = kilnd.NewStub();
      w.result = testing::WatchToEnd(*own, id, /*include_steps=*/true, absl::Minutes(30));
    });
  }
  // No ASSERT from here until the threads are joined (a joinable std::thread must not be
  // destroyed).
  EXPECT_TRUE(WaitFor([&] { return GetJob(*stub, id).global_step() > 0; }, absl::Seconds(60)));

  // The load: clients and a sampler of kilnd's resident memory.
  const std::vector<uint8_t> images = serving::testing::SampleImages(kClients, 11);
  std::atomic<bool> stop{false};
  std::vector<ClientTally> tallies(kClients);
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      auto own = InferenceStub(kilnd.port());
      const inference::ModelInferRequest request =
          serving::testing::MakeRequest("digits", images.data() + c * serving::testing::kPixels, 1,
                                        "UINT8", serving::testing::Form::kRaw);
      ClientTally& t = tallies[c];
      int64_t expected_class = -1;
      while (!stop.load()) {
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        inference::ModelInferResponse response;
        const auto start = Clock::now();
        grpc::Status status = own->ModelInfer(&context, request, &response);
        const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
        std::string error;
        if (!status.ok()) {
          error = absl::StrCat("code ", static_cast<int>(status.error_code()), ": ",
                               status.error_message());
        } else {
          const serving::testing::Answer a = serving::testing::ReadAnswer(response);
          // The same image always gets the same answer from the same model.
          if (a.classes.size() != 1 || a.probabilities.size() != 10) {
            error = "malformed answer";
          } else if (expected_class >= 0 && a.classes[0] != expected_class) {
            error = absl::StrCat("class ", a.classes[0], ", earlier ", expected_class);
          } else {
            expected_class = a.classes[0];
          }
        }
        if (error.empty()) {
          ++t.ok;
          t.latencies_us.push_back(us);
        } else if (t.failed++ == 0) {
          t.first_error = error;
        }
        std::this_thread::sleep_for(kClientPause);
      }
    });
  }
  std::vector<std::pair<double, int64_t>> rss;  // (seconds into the load, bytes)
  const auto load_start = Clock::now();
  const double load_start_unix = absl::ToUnixMicros(absl::Now()) * 1e-6;
  const double kilnd_cpu_start = hardening::CpuSeconds(kilnd.pid());
  const double clients_cpu_start = hardening::CpuSeconds(getpid());
  const std::string loadavg_start = LoadAverage();
  std::thread sampler([&] {
    while (!stop.load()) {
      rss.emplace_back(std::chrono::duration<double>(Clock::now() - load_start).count(),
                       hardening::ResidentBytes(kilnd.pid()));
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  std::this_thread::sleep_for(std::chrono::seconds(load_seconds));
  stop = true;
  const double load_end_unix = absl::ToUnixMicros(absl::Now()) * 1e-6;
  const double load_elapsed = std::chrono::duration<double>(Clock::now() - load_start).count();
  const std::string loadavg_end = LoadAverage();
  const double kilnd_cores = (hardening::CpuSeconds(kilnd.pid()) - kilnd_cpu_start) / load_elapsed;
  const double clients_cores = (hardening::CpuSeconds(getpid()) - clients_cpu_start) / load_elapsed;
  for (std::thread& t : clients) t.join();
  sampler.join();
  {
    grpc::ClientContext context;
    v1::CancelJobRequest request;
    request.set_job_id(id);
    v1::Job cancelled;
    grpc::Status status = stub->CancelJob(&context, request, &cancelled);
    EXPECT_OK(status) << "the job was no longer running when the load ended: "
                      << status.error_message();
  }
  for (Watcher& w : watchers) w.thread.join();
  ASSERT_TRUE(WaitForState(*stub, id, v1::JOB_STATE_CANCELLED, absl::Seconds(60)));
  const int epochs_done = GetJob(*stub, id).epochs_done();

  // Speed without load again, to bracket the machine's own drift (other work on it).
  std::string after_id;
  const TrainingRate baseline_after =
      RateOf(RunUnloaded(*stub, kBaselineEpochs, &after_id), 0, kForever);

  // Requests: none failed.
  int64_t ok = 0, failed = 0;
  std::string first_error;
  std::vector<double> latencies;
  for (const ClientTally& t : tallies) {
    ok += t.ok;
    failed += t.failed;
    if (first_error.empty()) first_error = t.first_error;
    EXPECT_GT(t.ok, 0) << "a client got no answer at all";
    latencies.insert(latencies.end(), t.latencies_us.begin(), t.latencies_us.end());
  }
  EXPECT_EQ(failed, 0) << "first failure: " << first_error;

  // Subscribers: each saw the whole stream.
  for (int i = 0; i < kWatchers; ++i) ExpectCompleteStream(watchers[i].result, epochs_done, i);

  // Resident memory: flat from the first to the last window.
  const double window = std::min(10.0, load_elapsed / 3);
  int64_t first_max = 0, last_max = 0;
  for (const auto& [t, bytes] : rss) {
    ASSERT_GT(bytes, 0) << "VmRSS of kilnd unreadable";
    if (t <= window) first_max = std::max(first_max, bytes);
    if (t >= load_elapsed - window) last_max = std::max(last_max, bytes);
  }
  EXPECT_LE(last_max, first_max + kRssToleranceBytes)
      << "kilnd's RSS grew from " << first_max << " to " << last_max << " bytes";

  // Measurements. The RSS line shows the curve: the max of each tenth of the load.
  std::string rss_curve;
  for (int tenth = 0; tenth < 10; ++tenth) {
    int64_t max = 0;
    for (const auto& [t, bytes] : rss) {
      if (t >= tenth * load_elapsed / 10 && t < (tenth + 1) * load_elapsed / 10) {
        max = std::max(max, bytes);
      }
    }
    absl::StrAppend(&rss_curve, " ", absl::StrFormat("%.1f", max / 1048576.0));
  }
  const TrainingRate loaded = RateOf(watchers[0].result.events, load_start_unix, load_end_unix);
  const double unloaded = (baseline_before.steps_per_sec + baseline_after.steps_per_sec) / 2;
  std::printf(
      "[ load     ] %d s, %d clients (%lld ms pause), %d subscribers, %d jobs/device, %u cores; "
      "machine load average %s at the start, %s at the end\n"
      "[ load     ] requests: %lld ok, %lld failed, %.0f/s; latency us p50 %.0f p90 %.0f "
      "p99 %.0f max %.0f\n"
      "[ load     ] training steps/s: %.1f unloaded before, %.1f after, %.1f under load "
      "(%d epochs): slowdown %.1f%%\n"
      "[ load     ] CPU cores used: kilnd %.2f, this process (clients, subscribers) %.2f\n"
      "[ load     ] kilnd RSS MiB: first %.0f s max %.1f, last %.0f s max %.1f; by tenths:%s\n",
      load_seconds, kClients, static_cast<long long>(kClientPause.count()), kWatchers,
      kJobsPerDevice, std::thread::hardware_concurrency(), loadavg_start.c_str(),
      loadavg_end.c_str(), static_cast<long long>(ok), static_cast<long long>(failed),
      ok / load_elapsed, Percentile(latencies, 0.5), Percentile(latencies, 0.9),
      Percentile(latencies, 0.99), Percentile(latencies, 1.0), baseline_before.steps_per_sec,
      baseline_after.steps_per_sec, loaded.steps_per_sec, loaded.epochs,
      100 * (1 - loaded.steps_per_sec / unloaded), kilnd_cores, clients_cores, window,
      first_max / 1048576.0, window, last_max / 1048576.0, rss_curve.c_str());
  EXPECT_GE(loaded.epochs, 1) << "no whole epoch ran under the load";
}

}  // namespace
}  // namespace kiln::server
