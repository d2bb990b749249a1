// Many WatchJob subscribers replaying a long finished job from its start: kilnd's resident memory
// must not grow with the length of the history times the watchers (issue 16: 200 watchers on a
// 96,000-step job took kilnd from 39 MB to 2.9 GB). The job is written into the store of a
// stopped kilnd (SQL, one transaction: a minute of training saved), and kilnd runs with a step
// bound above the job's steps, so the whole history is replayed, a page at a time.
//
// KILN_WATCH_REPLAY_STEPS (default 50,000) and KILN_WATCH_REPLAY_WATCHERS (default 50) scale it
// up for bench/RESULTS.md (100,000 and 200); KILN_WATCH_REPLAY_KILND runs another kilnd binary
// instead (one built before the paged replay, to measure what it took; it is started without
// --max_step_events_per_job, which it does not know).
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sqlite3.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "hardening_test_support.h"
#include "server/jobs/proto_time.h"
#include "server_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::server {
namespace {
namespace fs = std::filesystem;

constexpr int kStepsPerEpoch = 1000;
// What kilnd may grow by with every watcher open, over its size after one full replay. A replay
// holds one page (256 events, about 50 KiB) plus its stream's gRPC buffers; the history of the
// default job is about 10 MB as messages, so 50 watchers each holding it would add 500 MB.
constexpr int64_t kAllowedGrowthBytes = int64_t{64} << 20;

int EnvInt(const char* name, int fallback) {
  const char* value = std::getenv(name);
  int parsed = 0;
  return value != nullptr && absl::SimpleAtoi(value, &parsed) && parsed > 0 ? parsed : fallback;
}

// Writes a SUCCEEDED job "long" of `steps` steps, an epoch every kStepsPerEpoch, into the store
// at `db_path` (created by the kilnd under test, so of its schema): QUEUED (seq 1), RUNNING (2),
// the steps and epochs, SUCCEEDED last. Returns the number of events.
int64_t WriteFinishedJob(const std::string& db_path, int steps) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open_v2(db_path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
  auto exec = [&](const std::string& sql) {
    EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK)
        << sql << ": " << sqlite3_errmsg(db);
  };
  const int64_t now = NowMillis();
  const int epochs = steps / kStepsPerEpoch;
  exec("BEGIN");
  exec(absl::StrCat(
      "INSERT INTO jobs (id, state, device, create_ms, start_ms, end_ms, epochs, epochs_done, "
      "global_step, attempts) VALUES ('long', ",
      static_cast<int>(v1::JOB_STATE_SUCCEEDED), ", 'cpu', ", now, ", ", now, ", ", now, ", ",
      epochs, ", ", epochs, ", ", steps, ", 1)"));
  sqlite3_stmt* spec = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, "INSERT INTO specs VALUES ('long', ?)", -1, &spec, nullptr),
            SQLITE_OK);
  const std::string spec_bytes = testing::SmallSpec("toy", epochs).SerializeAsString();
  sqlite3_bind_blob(spec, 1, spec_bytes.data(), static_cast<int>(spec_bytes.size()),
                    SQLITE_TRANSIENT);
  EXPECT_EQ(sqlite3_step(spec), SQLITE_DONE);
  sqlite3_finalize(spec);
  for (const auto& [seq, state] :
       {std::pair{1, v1::JOB_STATE_QUEUED}, {2, v1::JOB_STATE_RUNNING}}) {
    exec(absl::StrCat("INSERT INTO state_changes VALUES ('long', ", seq, ", ", now, ", ",
                      static_cast<int>(state), ", '')"));
  }
  int64_t seq = 3;
  sqlite3_stmt* step = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db,
                               "INSERT INTO step_metrics (job_id, seq, time_ms, epoch, "
                               "step_in_epoch, steps_per_epoch, global_step, loss, lr, "
                               "samples_per_sec) VALUES ('long', ?, ?, ?, ?, ?, ?, ?, 0.01, 50000)",
                               -1, &step, nullptr),
            SQLITE_OK);
  for (int s = 1; s <= steps; ++s) {
    const int epoch = (s - 1) / kStepsPerEpoch + 1;
    sqlite3_bind_int64(step, 1, seq++);
    sqlite3_bind_int64(step, 2, now);
    sqlite3_bind_int(step, 3, epoch);
    sqlite3_bind_int(step, 4, (s - 1) % kStepsPerEpoch + 1);
    sqlite3_bind_int(step, 5, kStepsPerEpoch);
    sqlite3_bind_int64(step, 6, s);
    sqlite3_bind_double(step, 7, 2.3 / (1 + s * 1e-3));
    EXPECT_EQ(sqlite3_step(step), SQLITE_DONE);
    sqlite3_reset(step);
    if (s % kStepsPerEpoch == 0) {
      exec(absl::StrCat("INSERT INTO epoch_metrics VALUES ('long', ", seq++, ", ", now, ", ", epoch,
                        ", 0.5, 0.9, 0.5, 0.9, 1000, 1.0, 50000, 0.01)"));
    }
  }
  sqlite3_finalize(step);
  exec(absl::StrCat("INSERT INTO state_changes VALUES ('long', ", seq, ", ", now, ", ",
                    static_cast<int>(v1::JOB_STATE_SUCCEEDED), ", '')"));
  exec("COMMIT");
  sqlite3_close(db);
  return seq;
}

// One open WatchJob stream that has received its first event.
struct OpenWatch {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader;
};

TEST(WatchReplayMemoryTest, WatchersReplayingALongJobHoldAPageEachNotTheHistory) {
  const int steps = EnvInt("KILN_WATCH_REPLAY_STEPS", 50'000);
  const int watchers = EnvInt("KILN_WATCH_REPLAY_WATCHERS", 50);
  const char* other_kilnd = std::getenv("KILN_WATCH_REPLAY_KILND");
  const std::string root = testing::MakeTempDir("kilnd-watch-replay");
  std::vector<std::string> flags = {"--metrics_listen=",
                                    absl::StrCat("--max_streams=", watchers + 8)};
  if (other_kilnd == nullptr) {
    flags.push_back(absl::StrCat("--max_step_events_per_job=", 2 * steps));
  }
  // A first kilnd creates the store; the job goes in while it is stopped.
  {
    testing::KilndProcess creator(root + "/state", root + "/data", flags);
    if (other_kilnd != nullptr) creator.set_binary(other_kilnd);
    ASSERT_TRUE(creator.Start());
    ASSERT_EQ(creator.Stop(SIGTERM, absl::Seconds(20)), 0);
  }
  const absl::Time seed_start = absl::Now();
  const int64_t events = WriteFinishedJob(root + "/state/kiln.db", steps);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const double seed_seconds = absl::ToDoubleSeconds(absl::Now() - seed_start);
  testing::KilndProcess kilnd(root + "/state", root + "/data", flags);
  if (other_kilnd != nullptr) kilnd.set_binary(other_kilnd);
  ASSERT_TRUE(kilnd.Start());
  auto stub = kilnd.NewStub();
  const int64_t started = hardening::ResidentBytes(kilnd.pid());

  // One whole replay first: every event once, in order; kilnd's SQLite cache and gRPC buffers
  // are then warm, so what follows is the watchers' own cost.
  const absl::Time replay_start = absl::Now();
  testing::WatchResult whole = testing::WatchToEnd(*stub, "long", /*include_steps=*/true);
  const double replay_seconds = absl::ToDoubleSeconds(absl::Now() - replay_start);
  ASSERT_OK(whole.status) << whole.status.error_message();
  ASSERT_EQ(static_cast<int64_t>(whole.events.size()), events);
  for (int64_t i = 0; i < events; ++i) {
    ASSERT_EQ(whole.events[i].seq(), i + 1) << "a gap or a repeat";
  }
  EXPECT_EQ(whole.events.back().state().state(), v1::JOB_STATE_SUCCEEDED);
  whole = {};
  const int64_t baseline = hardening::ResidentBytes(kilnd.pid());

  // Every watcher open at once, each having received its first event (so kilnd has set up its
  // replay), each then pushed by kilnd until the stream's flow-control window is full.
  std::vector<std::unique_ptr<OpenWatch>> open;
  v1::WatchJobRequest request;
  request.set_job_id("long");
  request.set_include_steps(true);
  for (int i = 0; i < watchers; ++i) {
    auto w = std::make_unique<OpenWatch>();
    w->reader = stub->WatchJob(&w->context, request);
    v1::JobEvent first;
    ASSERT_TRUE(w->reader->Read(&first)) << "watcher " << i << " got nothing";
    ASSERT_EQ(first.seq(), 1);
    open.push_back(std::move(w));
  }
  int64_t peak = 0;
  for (int i = 0; i < 20; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    peak = std::max(peak, hardening::ResidentBytes(kilnd.pid()));
  }
  for (auto& w : open) w->context.TryCancel();
  for (auto& w : open) (void)w->reader->Finish();
  open.clear();
  absl::SleepFor(absl::Milliseconds(500));
  const int64_t after = hardening::ResidentBytes(kilnd.pid());
  ASSERT_GT(baseline, 0) << "VmRSS of kilnd unreadable";

  const double mib = 1 << 20;
  std::printf(
      "[ replay   ] %d steps (%lld events; written in %.1f s, one whole replay %.1f s): kilnd RSS "
      "MiB at start %.1f, after one replay %.1f, with %d watchers open %.1f (+%.1f), after they "
      "left %.1f\n",
      steps, static_cast<long long>(events), seed_seconds, replay_seconds, started / mib,
      baseline / mib, watchers, peak / mib, (peak - baseline) / mib, after / mib);
  EXPECT_LT(peak - baseline, kAllowedGrowthBytes)
      << watchers << " watchers of a " << steps << "-step job grew kilnd from " << baseline
      << " to " << peak << " bytes";
  stub.reset();
  EXPECT_EQ(kilnd.Stop(SIGTERM, absl::Seconds(20)), 0);
  std::error_code ec;
  fs::remove_all(root, ec);
}

}  // namespace
}  // namespace kiln::server
