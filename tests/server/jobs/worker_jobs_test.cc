// Jobs of several workers, kilnd's side: the attempt state the Workers service and the runner
// share (joins, rendezvous keys, reports, commands), the worker token, the checks Submit makes,
// and whole jobs run by a kilnd subprocess with real kiln-worker processes: a 2-worker job trains
// to the same model as one process, a killed worker fails the job (or is retried), a cancel
// stops every rank with a checkpoint, and the metrics carry each rank.
#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/v1/worker.grpc.pb.h"
#include "server/datasets/dataset_catalog.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/job_store.h"
#include "server/jobs/metric_broadcaster.h"
#include "server/jobs/worker_attempt.h"
#include "server_test_support.h"
#include "tests/support/status_matchers.h"
#include "tests/support/subprocess.h"

namespace kiln::server {
namespace {
namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::SmallSpec;
using testing::WaitFor;

constexpr absl::Duration kWait = absl::Seconds(120);

const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}
MATCHER_P2(StatusCodeAndMessage, code, message, "") {
  const absl::Status& s = StatusOf(arg);
  *result_listener << "whose status is " << s.ToString();
  return s.code() == code &&
         ::testing::ExplainMatchResult(message, std::string(s.message()), result_listener);
}
auto StatusIs(absl::StatusCode code) { return StatusCodeAndMessage(code, ::testing::_); }
template <typename M>
auto StatusIs(absl::StatusCode code, M message) {
  return StatusCodeAndMessage(code, message);
}
MATCHER_P(IsOkAndHolds, value, "") {
  if (!arg.ok()) {
    *result_listener << "whose status is " << arg.status().ToString();
    return false;
  }
  return *arg == value;
}

v1::JoinJobResponse TwoRankJoin() {
  v1::JoinJobResponse join;
  join.set_attempt(1);
  join.set_world_size(2);
  join.set_epochs(3);
  join.set_dataset("toy");
  join.mutable_resume_from()->set_id(42);
  return join;
}

v1::WorkerReport Hello(int rank) {
  v1::WorkerReport r;
  r.mutable_hello()->set_rank(rank);
  r.mutable_hello()->set_job_id("job-1");
  return r;
}

TEST(WorkerAttemptTest, EachRankJoinsOnceWithItsDeviceAndOnlyRankZeroGetsTheStart) {
  WorkerAttempt attempt("job-1", TwoRankJoin(), {"cuda:2", "cuda:5"}, {});
  absl::StatusOr<v1::JoinJobResponse> zero = attempt.Join(0, "a");
  ASSERT_OK(zero);
  EXPECT_EQ(zero->device(), "cuda:2");
  EXPECT_EQ(zero->resume_from().id(), 42);
  absl::StatusOr<v1::JoinJobResponse> one = attempt.Join(1, "b");
  ASSERT_OK(one);
  EXPECT_EQ(one->device(), "cuda:5");
  EXPECT_EQ(one->resume_from().id(), 0);
  EXPECT_EQ(one->world_size(), 2);
  EXPECT_THAT(attempt.Join(1, "c"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("joined already")));
  EXPECT_THAT(attempt.Join(2, "d"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank 2 is outside")));
  EXPECT_THAT(attempt.Join(-1, "d"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(WorkerAttemptTest, GetKeyWaitsForTheKeyTimesOutNamingItAndEndsWithTheAttempt) {
  WorkerAttempt attempt("job-1", TwoRankJoin(), {"cpu", "cpu"}, {});
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_OK(attempt.SetKey("rank/1/address", "127.0.0.1:4000"));
  });
  EXPECT_THAT(attempt.GetKey("rank/1/address", absl::Seconds(30)),
              IsOkAndHolds(std::string("127.0.0.1:4000")));
  setter.join();
  EXPECT_THAT(attempt.GetKey("never", absl::Milliseconds(20)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("\"never\"")));
  EXPECT_THAT(attempt.SetKey("", "x"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(attempt.SetKey("big", std::string((1 << 20) + 1, 'x')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 MiB")));
  std::thread ender([&] {
    absl::SleepFor(absl::Milliseconds(50));
    attempt.End();
  });
  EXPECT_THAT(attempt.GetKey("never", absl::Seconds(30)), StatusIs(absl::StatusCode::kAborted));
  ender.join();
}

TEST(WorkerAttemptTest, ReportsInOrderReachTheHookAndAFailureOrASilentEndFailsTheAttempt) {
  std::vector<std::string> seen;
  WorkerAttempt::Hooks hooks;
  hooks.on_report = [&](int rank, const v1::WorkerReport& r) {
    seen.push_back(absl::StrCat(rank, ":", r.has_step() ? "step" : "epoch"));
    return absl::OkStatus();
  };
  WorkerAttempt attempt("job-1", TwoRankJoin(), {"cpu", "cpu"}, hooks);
  v1::WorkerReport step;
  step.mutable_step()->mutable_metrics()->set_global_step(1);
  EXPECT_THAT(attempt.Report(0, Hello(0)), StatusIs(absl::StatusCode::kFailedPrecondition))
      << "hello before joining";
  ASSERT_OK(attempt.Join(0, "a"));
  EXPECT_THAT(attempt.Report(0, step),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("before its hello")));
  ASSERT_OK(attempt.Report(0, Hello(0)));
  ASSERT_OK(attempt.Report(0, step));
  EXPECT_EQ(seen, std::vector<std::string>{"0:step"});
  EXPECT_OK(attempt.State().failure);

  ASSERT_OK(attempt.Join(1, "b"));
  ASSERT_OK(attempt.Report(1, Hello(1)));
  attempt.StreamEnded(1);  // no done, no failed: the worker died
  EXPECT_THAT(attempt.State().failure,
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("worker rank 1 went away")));
  // The first failure is the reason; later ones do not replace it.
  v1::WorkerReport failed;
  failed.mutable_failed()->set_code(static_cast<int>(absl::StatusCode::kInternal));
  failed.mutable_failed()->set_message("rank 0: out of luck");
  ASSERT_OK(attempt.Report(0, failed));
  EXPECT_THAT(attempt.State().failure, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(attempt.State().ranks[0], RankState::kFailed);
}

// The runner behind the hooks goes once End returns: a hook still running must finish first,
// and none may start after.
TEST(WorkerAttemptTest, EndWaitsForARunningHookAndRefusesLaterReports) {
  std::atomic<bool> in_hook{false}, release{false}, hook_done{false};
  WorkerAttempt::Hooks hooks;
  hooks.on_report = [&](int, const v1::WorkerReport&) {
    in_hook = true;
    while (!release) absl::SleepFor(absl::Milliseconds(1));
    hook_done = true;
    return absl::OkStatus();
  };
  WorkerAttempt attempt("job-1", TwoRankJoin(), {"cpu", "cpu"}, hooks);
  ASSERT_OK(attempt.Join(0, "a"));
  ASSERT_OK(attempt.Report(0, Hello(0)));
  v1::WorkerReport step;
  step.mutable_step()->mutable_metrics()->set_global_step(1);
  std::thread reporter([&] { EXPECT_OK(attempt.Report(0, step)); });
  ASSERT_TRUE(WaitFor([&] { return in_hook.load(); }, kWait));
  std::atomic<bool> ended{false};
  std::thread ender([&] {
    attempt.End();
    ended = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(ended) << "End returned while a hook ran";
  release = true;
  ender.join();
  EXPECT_TRUE(hook_done);
  reporter.join();
  EXPECT_THAT(attempt.Report(0, step), StatusIs(absl::StatusCode::kAborted));
}

TEST(WorkerAttemptTest, AWorkersOwnFailureIsTheAttemptsReason) {
  WorkerAttempt attempt("job-1", TwoRankJoin(), {"cpu", "cpu"}, {});
  ASSERT_OK(attempt.Join(1, "b"));
  ASSERT_OK(attempt.Report(1, Hello(1)));
  v1::WorkerReport failed;
  failed.mutable_failed()->set_code(static_cast<int>(absl::StatusCode::kUnavailable));
  failed.mutable_failed()->set_message("rank 1: allreduce: peer 0 closed the connection");
  ASSERT_OK(attempt.Report(1, failed));
  attempt.StreamEnded(1);
  EXPECT_THAT(attempt.State().failure,
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("peer 0 closed")));
}

TEST(WorkerAttemptTest, CommandsGoToRankZeroAlone) {
  WorkerAttempt attempt("job-1", TwoRankJoin(), {"cpu", "cpu"}, {});
  attempt.Command(v1::WorkerCommand::ACTION_CHECKPOINT);
  EXPECT_FALSE(attempt.NextCommand(1, absl::Milliseconds(20)).has_value());
  std::optional<v1::WorkerCommand> c = attempt.NextCommand(0, absl::Milliseconds(20));
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->action(), v1::WorkerCommand::ACTION_CHECKPOINT);
  EXPECT_FALSE(attempt.NextCommand(0, absl::Milliseconds(20)).has_value());
}

TEST(WorkerRegistryTest, TokensArePerJobAndStableAndOnlyTheRightOneFindsTheAttempt) {
  WorkerRegistry registry(std::string(32, 'k'));
  WorkerRegistry same_key(std::string(32, 'k'));
  WorkerRegistry other_key(std::string(32, 'q'));
  EXPECT_EQ(registry.TokenFor("job-1"), same_key.TokenFor("job-1"));
  EXPECT_NE(registry.TokenFor("job-1"), registry.TokenFor("job-2"));
  EXPECT_NE(registry.TokenFor("job-1"), other_key.TokenFor("job-1"));
  EXPECT_EQ(registry.TokenFor("job-1").size(), 64u);  // hex of HMAC-SHA256

  EXPECT_THAT(registry.Find("job-1", registry.TokenFor("job-1")),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not running")));
  auto attempt = std::make_shared<WorkerAttempt>(
      "job-1", TwoRankJoin(), std::vector<std::string>{"cpu", "cpu"}, WorkerAttempt::Hooks{});
  registry.Add(attempt);
  EXPECT_THAT(registry.Find("job-1", registry.TokenFor("job-1")), IsOkAndHolds(attempt));
  EXPECT_THAT(registry.Find("job-1", registry.TokenFor("job-2")),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("kiln worker-token job-1")));
  EXPECT_THAT(registry.Find("job-1", ""), StatusIs(absl::StatusCode::kUnauthenticated));
  registry.Remove(attempt.get());
  EXPECT_THAT(registry.Find("job-1", registry.TokenFor("job-1")),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(WorkerRegistryTest, TheKeyIsMadeOncePrivatelyAndReadAgain) {
  const std::string dir = testing::MakeTempDir("worker-key");
  const std::string path = dir + "/worker-token.key";
  absl::StatusOr<std::string> made = LoadOrCreateWorkerKey(path);
  ASSERT_OK(made);
  EXPECT_EQ(made->size(), 32u);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_THAT(LoadOrCreateWorkerKey(path), IsOkAndHolds(*made));
  std::ofstream(path, std::ios::trunc) << "short";
  EXPECT_THAT(LoadOrCreateWorkerKey(path),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("fewer than a worker key's 32")));
}

// Submit's checks, on a job manager with no process started.
class WorkerSubmitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::MakeTempDir("worker-submit");
    fs::create_directories(root_ + "/state");
    testing::WriteToyDataset(root_ + "/data/toy", 256, 64);
    store_ = *JobStore::Open(root_ + "/state/kiln.db");
    catalog_ = std::make_unique<DatasetCatalog>(root_ + "/data", int64_t{1} << 30);
    // An executable that is not kiln-worker: Submit only checks that one is there.
    worker_ = root_ + "/kiln-worker";
    std::ofstream(worker_) << "#!/bin/sh\nexit 3\n";
    fs::permissions(worker_, fs::perms::owner_all);
  }
  void Start(bool with_registry, std::string worker_binary) {
    JobManagerOptions options;
    options.state_dir = root_ + "/state";
    options.workers.registry = with_registry ? &registry_ : nullptr;
    options.workers.worker_binary = std::move(worker_binary);
    options.workers.state_dir = options.state_dir;
    options.workers.join_timeout = absl::Seconds(30);
    manager_ = std::make_unique<JobManager>(store_.get(), &broadcaster_, catalog_.get(), options);
    ASSERT_OK(manager_->Recover());
  }
  void TearDown() override {
    manager_.reset();
    store_.reset();
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  static v1::JobSpec TwoWorkers() {
    v1::JobSpec spec = SmallSpec("toy", 1);
    spec.set_workers(2);
    return spec;
  }

  std::string root_, worker_;
  std::unique_ptr<JobStore> store_;
  MetricBroadcaster broadcaster_{16};
  std::unique_ptr<DatasetCatalog> catalog_;
  WorkerRegistry registry_{std::string(32, 'k')};
  std::unique_ptr<JobManager> manager_;
};

TEST_F(WorkerSubmitTest, BadWorkerFieldsAreRefusedNamingTheField) {
  Start(true, worker_);
  v1::JobSpec spec = TwoWorkers();
  spec.set_workers(65);
  EXPECT_THAT(manager_->Submit(spec), StatusIs(absl::StatusCode::kInvalidArgument,
                                               HasSubstr("spec.workers: 65 is outside 1..64")));
  spec.set_workers(-1);
  EXPECT_THAT(manager_->Submit(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("spec.workers")));
  spec = TwoWorkers();
  spec.set_max_retries(101);
  EXPECT_THAT(manager_->Submit(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("spec.max_retries: 101")));
  spec = SmallSpec("toy", 1);
  spec.set_max_retries(2);
  EXPECT_THAT(manager_->Submit(spec), StatusIs(absl::StatusCode::kInvalidArgument,
                                               HasSubstr("only jobs of several workers retry")));
  spec = TwoWorkers();
  spec.set_device("cuda:0");
  EXPECT_THAT(manager_->Submit(spec),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("takes \"cpu\" or \"cuda\" (one GPU each), not \"cuda:0\"")));
  spec = TwoWorkers();
  spec.set_device("cuda");
  EXPECT_THAT(manager_->Submit(spec),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("need as many GPUs")));
  // 3 samples a batch cannot give 4 ranks one each.
  spec = TwoWorkers();
  spec.set_workers(4);
  spec.set_batch_size(3);
  EXPECT_THAT(manager_->Submit(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("spec.workers: ")));
  EXPECT_EQ(manager_->List({}, 100, "")->jobs.size(), 0u) << "nothing refused was queued";
}

TEST_F(WorkerSubmitTest, AKilndThatCannotStartWorkersSaysSo) {
  Start(true, root_ + "/no-such-kiln-worker");
  EXPECT_THAT(manager_->Submit(TwoWorkers()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("no-such-kiln-worker is not an executable (--worker_binary)")));
  // Workers started elsewhere need no executable here.
  v1::JobSpec external = TwoWorkers();
  external.set_external_workers(true);
  EXPECT_OK(manager_->Submit(external));
  manager_.reset();
  Start(false, worker_);
  EXPECT_THAT(manager_->Submit(TwoWorkers()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("does not run jobs of several workers")));
}

TEST_F(WorkerSubmitTest, OnlyJobsOfWorkersHaveAToken) {
  Start(true, worker_);
  absl::StatusOr<v1::Job> single = manager_->Submit(SmallSpec("toy", 1));
  ASSERT_OK(single);
  EXPECT_THAT(manager_->WorkerToken(single->id()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("has no workers")));
  v1::JobSpec external = TwoWorkers();
  external.set_external_workers(true);
  absl::StatusOr<v1::Job> job = manager_->Submit(external);
  ASSERT_OK(job);
  EXPECT_THAT(manager_->WorkerToken(job->id()), IsOkAndHolds(registry_.TokenFor(job->id())));
  EXPECT_THAT(manager_->WorkerToken("job-nope"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(WorkerSubmitTest, ExternalWorkersThatNeverComeFailTheJobNamingTheRanks) {
  JobManagerOptions options;
  Start(true, worker_);
  manager_.reset();
  // Again with a short join timeout.
  JobManagerOptions short_wait;
  short_wait.state_dir = root_ + "/state";
  short_wait.workers.registry = &registry_;
  short_wait.workers.worker_binary = worker_;
  short_wait.workers.state_dir = short_wait.state_dir;
  short_wait.workers.external_join_timeout = absl::Milliseconds(300);
  manager_ = std::make_unique<JobManager>(store_.get(), &broadcaster_, catalog_.get(), short_wait);
  ASSERT_OK(manager_->Recover());
  v1::JobSpec external = TwoWorkers();
  external.set_external_workers(true);
  absl::StatusOr<v1::Job> job = manager_->Submit(external);
  ASSERT_OK(job);
  v1::Job seen;
  ASSERT_TRUE(WaitFor(
      [&] {
        seen = *manager_->Get(job->id());
        return seen.state() == v1::JOB_STATE_FAILED;
      },
      kWait));
  EXPECT_THAT(seen.reason(), HasSubstr("worker ranks 0, 1 did not join within 300ms"));
}

TEST_F(WorkerSubmitTest, AWorkerThatExitsAtOnceFailsTheJobWithItsStatusAndLog) {
  // The stand-in exits 3 without a word to kilnd: the job fails naming the rank and status.
  std::ofstream(worker_, std::ios::trunc) << "#!/bin/sh\necho \"bad flags: $*\"\nexit 3\n";
  JobManagerOptions options;
  options.state_dir = root_ + "/state";
  options.workers.registry = &registry_;
  options.workers.worker_binary = worker_;
  options.workers.state_dir = options.state_dir;
  options.workers.data_dir = root_ + "/data";
  manager_ = std::make_unique<JobManager>(store_.get(), &broadcaster_, catalog_.get(), options);
  ASSERT_OK(manager_->Recover());
  registry_.SetCoordinatorAddress("127.0.0.1:1");
  absl::StatusOr<v1::Job> job = manager_->Submit(TwoWorkers());
  ASSERT_OK(job);
  v1::Job seen;
  ASSERT_TRUE(WaitFor(
      [&] {
        seen = *manager_->Get(job->id());
        return seen.state() == v1::JOB_STATE_FAILED;
      },
      kWait));
  EXPECT_THAT(seen.reason(), HasSubstr("exited with status 3: bad flags: --coordinator "
                                       "127.0.0.1:1 --job "));
  EXPECT_THAT(seen.reason(), HasSubstr("(log: "));
}

// Whole jobs: a kilnd subprocess starts real kiln-worker processes (built beside it).
class WorkerJobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::MakeTempDir("worker-jobs");
    testing::WriteToyDataset(root_ + "/data/toy", 256, 64);
    const fs::path worker = fs::path(KILND_PATH).parent_path() / "kiln-worker";
    ASSERT_TRUE(fs::exists(worker)) << worker << " is missing: build the kiln-worker target";
  }
  void TearDown() override {
    kilnd_.reset();
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  // kilnd with /metrics, each worker step slowed by `step_delay` so tests can act mid-run.
  void StartKilnd(const std::string& step_delay = "0s") {
    kilnd_ = std::make_unique<kiln::testing::KilndChild>();
    ASSERT_TRUE(
        kilnd_->Start(root_ + "/state", root_ + "/data",
                      {absl::StrCat("--step_delay=", step_delay), "--worker_join_timeout=60s"},
                      /*metrics=*/true));
    channel_ = grpc::CreateChannel(kilnd_->address(), grpc::InsecureChannelCredentials());
    stub_ = v1::Training::NewStub(channel_);
  }
  static v1::JobSpec Workers(int workers, int epochs) {
    v1::JobSpec spec = SmallSpec("toy", epochs);
    spec.set_workers(workers);
    return spec;
  }
  v1::Job Get(const std::string& id) { return testing::GetJob(*stub_, id); }
  // A job of two CPU workers for 2 epochs in fp32 (the default precision), then the same in
  // `precision`, each as it ended.
  std::pair<v1::Job, v1::Job> TrainWorkersInFp32And(v1::Precision precision) {
    v1::JobSpec spec = Workers(2, 2);
    const v1::Job fp32 = WaitForEnd(testing::SubmitJob(*stub_, spec));
    spec.set_precision(precision);
    return {fp32, WaitForEnd(testing::SubmitJob(*stub_, spec))};
  }
  v1::Job WaitForEnd(const std::string& id) {
    v1::Job job;
    WaitFor(
        [&] {
          job = Get(id);
          return job.state() == v1::JOB_STATE_SUCCEEDED || job.state() == v1::JOB_STATE_FAILED ||
                 job.state() == v1::JOB_STATE_CANCELLED;
        },
        kWait);
    return job;
  }
  bool WaitForSteps(const std::string& id, int64_t steps) {
    return WaitFor([&] { return Get(id).global_step() >= steps; }, kWait);
  }
  // The pids of the job's kiln-worker processes, by their command lines.
  static std::vector<std::pair<int, pid_t>> WorkerPids(const std::string& job_id) {
    std::vector<std::pair<int, pid_t>> found;
    for (const fs::directory_entry& e : fs::directory_iterator("/proc")) {
      const std::string name = e.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream in(e.path() / "cmdline", std::ios::binary);
      std::stringstream bytes;
      bytes << in.rdbuf();
      std::vector<std::string> args = absl::StrSplit(bytes.str(), '\0');
      if (args.empty() || !absl::EndsWith(args[0], "kiln-worker")) continue;
      auto job = std::find(args.begin(), args.end(), "--job");
      auto rank = std::find(args.begin(), args.end(), "--rank");
      if (job == args.end() || job + 1 == args.end() || *(job + 1) != job_id) continue;
      if (rank == args.end() || rank + 1 == args.end()) continue;
      found.emplace_back(std::stoi(*(rank + 1)), static_cast<pid_t>(std::stoi(name)));
    }
    std::sort(found.begin(), found.end());
    return found;
  }
  std::string Metrics() {
    httplib::Client client("127.0.0.1", kilnd_->metrics_port());
    httplib::Result r = client.Get("/metrics");
    return r ? r->body : "";
  }

  std::string root_;
  std::unique_ptr<kiln::testing::KilndChild> kilnd_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Training::Stub> stub_;
};

TEST_F(WorkerJobsTest, TwoWorkersTrainTheModelOneProcessTrainsWithEveryRankReporting) {
  ASSERT_NO_FATAL_FAILURE(StartKilnd());
  const std::string two = testing::SubmitJob(*stub_, Workers(2, 2));
  const std::string one = testing::SubmitJob(*stub_, SmallSpec("toy", 2));
  const v1::Job two_done = WaitForEnd(two);
  const v1::Job one_done = WaitForEnd(one);
  ASSERT_EQ(two_done.state(), v1::JOB_STATE_SUCCEEDED) << two_done.reason();
  ASSERT_EQ(one_done.state(), v1::JOB_STATE_SUCCEEDED) << one_done.reason();
  EXPECT_EQ(two_done.device(), "cpu");
  EXPECT_EQ(two_done.epochs_done(), 2);
  EXPECT_EQ(two_done.global_step(), one_done.global_step());
  // The same mathematics: only the order of summing the samples' gradients differs.
  EXPECT_NEAR(two_done.last_epoch().train_loss(), one_done.last_epoch().train_loss(), 1e-4);
  EXPECT_NEAR(two_done.last_epoch().test_loss(), one_done.last_epoch().test_loss(), 1e-4);
  EXPECT_NEAR(two_done.last_epoch().test_accuracy(), one_done.last_epoch().test_accuracy(),
              1.0 / 64 + 1e-9);

  testing::WatchResult watch = testing::WatchToEnd(*stub_, two, /*include_steps=*/true);
  ASSERT_OK(watch.status);
  int steps = 0, epochs = 0, checkpoints = 0;
  int64_t last_seq = 0, last_step = 0;
  for (const v1::JobEvent& e : watch.events) {
    EXPECT_GT(e.seq(), last_seq);
    last_seq = e.seq();
    if (e.has_step()) {
      ++steps;
      EXPECT_EQ(e.step().global_step(), last_step + 1) << "rank 0's steps, each once, in order";
      last_step = e.step().global_step();
      EXPECT_EQ(e.step().rank_samples_per_sec_size(), 2);
    }
    epochs += e.has_epoch() ? 1 : 0;
    if (e.has_checkpoint()) {
      ++checkpoints;
      EXPECT_EQ(e.checkpoint().kind(), v1::CHECKPOINT_KIND_FINAL);
      EXPECT_EQ(e.checkpoint().global_step(), two_done.global_step());
    }
  }
  EXPECT_EQ(steps, two_done.global_step());
  EXPECT_EQ(epochs, 2);
  EXPECT_EQ(checkpoints, 1);
  EXPECT_TRUE(WorkerPids(two).empty()) << "the workers exited";

  const std::string metrics = Metrics();
  EXPECT_THAT(metrics, HasSubstr(absl::StrCat("kiln_job_workers{job_id=\"", two)));
  EXPECT_THAT(metrics, HasSubstr("kiln_worker_samples_per_second{"));
  EXPECT_THAT(metrics, HasSubstr("rank=\"1\""));
  EXPECT_THAT(metrics, HasSubstr("kiln_allreduce_bytes_total{"));
  EXPECT_THAT(metrics, HasSubstr("kiln_allreduce_duration_seconds_count{"));
}

// Every rank builds its backend from the spec it is handed: a tf32 job of two CPU workers trains
// as the same job in fp32 does, to the bit (a CPU has no TF32 units), and keeps its precision.
TEST_F(WorkerJobsTest, TheWorkersOfATf32JobOnTheCpuTrainAsFp32Workers) {
  ASSERT_NO_FATAL_FAILURE(StartKilnd());
  const auto [fp32, tf32] = TrainWorkersInFp32And(v1::PRECISION_TF32);
  ASSERT_EQ(fp32.state(), v1::JOB_STATE_SUCCEEDED) << fp32.reason();
  ASSERT_EQ(tf32.state(), v1::JOB_STATE_SUCCEEDED) << tf32.reason();
  EXPECT_EQ(tf32.spec().precision(), v1::PRECISION_TF32);
  EXPECT_EQ(tf32.global_step(), fp32.global_step());
  EXPECT_EQ(tf32.last_epoch().train_loss(), fp32.last_epoch().train_loss());
  EXPECT_EQ(tf32.last_epoch().test_loss(), fp32.last_epoch().test_loss());
}

// Each rank's backend takes bf16 from the spec it is handed, as it takes tf32: the job of two
// CPU workers succeeds, keeps its precision and lands near the fp32 one (bfloat16 rounding moves
// the loss; 3% is training_service_test's measured allowance for this toy MLP).
TEST_F(WorkerJobsTest, TheWorkersOfABf16JobOnTheCpuTrainNearFp32Workers) {
  ASSERT_NO_FATAL_FAILURE(StartKilnd());
  const auto [fp32, bf16] = TrainWorkersInFp32And(v1::PRECISION_BF16);
  ASSERT_EQ(fp32.state(), v1::JOB_STATE_SUCCEEDED) << fp32.reason();
  ASSERT_EQ(bf16.state(), v1::JOB_STATE_SUCCEEDED) << bf16.reason();
  EXPECT_EQ(bf16.spec().precision(), v1::PRECISION_BF16);
  EXPECT_EQ(bf16.global_step(), fp32.global_step());
  const double fp32_loss = fp32.last_epoch().train_loss();
  EXPECT_NEAR(bf16.last_epoch().train_loss(), fp32_loss, 0.03 * fp32_loss);
}

TEST_F(WorkerJobsTest, AKilledWorkerFailsTheJobNamingARankAndNoWorkerIsLeft) {
  ASSERT_NO_FATAL_FAILURE(StartKilnd("20ms"));
  const std::string id = testing::SubmitJob(*stub_, Workers(2, 1000));
  ASSERT_TRUE(WaitForSteps(id, 3)) << Get(id).reason();
  std::vector<std::pair<int, pid_t>> pids = WorkerPids(id);
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_EQ(kill(pids[1].second, SIGKILL), 0);
  const v1::Job job = WaitForEnd(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("rank"));
  EXPECT_EQ(job.retries(), 0);
  EXPECT_TRUE(WaitFor([&] { return WorkerPids(id).empty(); }, absl::Seconds(30)))
      << "rank 0 was stopped too";
}

TEST_F(WorkerJobsTest, AFailedAttemptIsRetriedFromTheLatestCheckpoint) {
  ASSERT_NO_FATAL_FAILURE(StartKilnd("20ms"));
  v1::JobSpec spec = Workers(2, 3);
  spec.set_max_retries(1);
  spec.mutable_checkpoint_policy()->set_every_n_epochs(1);
  const std::string id = testing::SubmitJob(*stub_, spec);
  // Into the second epoch (8 steps an epoch), after the first epoch's checkpoint.
  ASSERT_TRUE(WaitFor([&] { return testing::ListCheckpoints(*stub_, id).size() >= 1; }, kWait));
  ASSERT_TRUE(WaitForSteps(id, 10));
  std::vector<std::pair<int, pid_t>> pids = WorkerPids(id);
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_EQ(kill(pids[0].second, SIGKILL), 0);
  const v1::Job job = WaitForEnd(id);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  EXPECT_EQ(job.retries(), 1);
  EXPECT_EQ(job.attempts(), 2);
  EXPECT_GE(job.resumed_from_step(), 8) << "the second attempt started from a checkpoint";
  EXPECT_EQ(job.epochs_done(), 3);
  testing::WatchResult watch = testing::WatchToEnd(*stub_, id);
  bool retried = false;
  for (const v1::JobEvent& e : watch.events) {
    if (e.has_state() && absl::StrContains(e.state().reason(), "retry 1 of 1")) retried = true;
  }
  EXPECT_TRUE(retried) << "a state event says why the job started again";
}

TEST_F(WorkerJobsTest, CancelAndCheckpointNowReachEveryRank) {
  ASSERT_NO_FATAL_FAILURE(StartKilnd("20ms"));
  const std::string id = testing::SubmitJob(*stub_, Workers(2, 1000));
  ASSERT_TRUE(WaitForSteps(id, 3)) << Get(id).reason();
  grpc::ClientContext context;
  v1::CreateCheckpointRequest request;
  request.set_job_id(id);
  v1::Checkpoint made;
  ASSERT_OK(stub_->CreateCheckpoint(&context, request, &made));
  EXPECT_EQ(made.kind(), v1::CHECKPOINT_KIND_ON_DEMAND);
  EXPECT_GT(made.global_step(), 0);

  grpc::ClientContext cancel_context;
  v1::CancelJobRequest cancel;
  cancel.set_job_id(id);
  v1::Job ignored;
  ASSERT_OK(stub_->CancelJob(&cancel_context, cancel, &ignored));
  const v1::Job job = WaitForEnd(id);
  EXPECT_EQ(job.state(), v1::JOB_STATE_CANCELLED) << job.reason();
  std::vector<v1::Checkpoint> checkpoints = testing::ListCheckpoints(*stub_, id);
  ASSERT_FALSE(checkpoints.empty());
  EXPECT_EQ(checkpoints.back().kind(), v1::CHECKPOINT_KIND_CANCEL);
  EXPECT_TRUE(WaitFor([&] { return WorkerPids(id).empty(); }, absl::Seconds(30)));
}

TEST_F(WorkerJobsTest, AShutdownStopsTheWorkersAndTheJobResumesOnRestart) {
  ASSERT_NO_FATAL_FAILURE(StartKilnd("20ms"));
  const std::string id = testing::SubmitJob(*stub_, Workers(2, 3));
  ASSERT_TRUE(WaitForSteps(id, 3)) << Get(id).reason();
  ASSERT_EQ(kilnd_->Stop(SIGTERM, absl::Seconds(60)), 0) << kilnd_->Stderr();
  EXPECT_TRUE(WorkerPids(id).empty());
  ASSERT_NO_FATAL_FAILURE(StartKilnd());
  const v1::Job job = WaitForEnd(id);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  EXPECT_EQ(job.attempts(), 2);
  EXPECT_GE(job.resumed_from_step(), 3) << "resumed from the shutdown checkpoint";
  EXPECT_EQ(job.crash_resumes(), 0);
}

// A job of several workers is preempted as one unit: every worker stops (writing the policy's
// shutdown checkpoint), the job waits its turn, and resumes to the bits an uninterrupted run of
// the same spec reaches.
TEST_F(WorkerJobsTest, AHighPriorityJobPreemptsAJobOfWorkersWhichResumesToTheSameBits) {
  ASSERT_NO_FATAL_FAILURE(StartKilnd());
  v1::JobSpec low = Workers(2, 3);
  low.set_priority(v1::PRIORITY_LOW);
  const v1::Job uninterrupted = WaitForEnd(testing::SubmitJob(*stub_, low));
  ASSERT_EQ(uninterrupted.state(), v1::JOB_STATE_SUCCEEDED) << uninterrupted.reason();

  ASSERT_NO_FATAL_FAILURE(StartKilnd("20ms"));
  const std::string id = testing::SubmitJob(*stub_, low);
  ASSERT_TRUE(WaitForSteps(id, 3)) << Get(id).reason();
  v1::JobSpec high = SmallSpec("toy", 1);
  high.set_priority(v1::PRIORITY_HIGH);
  const std::string urgent = testing::SubmitJob(*stub_, high);
  ASSERT_TRUE(WaitFor([&] { return Get(id).state() == v1::JOB_STATE_QUEUED; }, kWait))
      << Get(id).reason();
  EXPECT_EQ(Get(id).reason(), "preempted by " + urgent);
  EXPECT_TRUE(WaitFor([&] { return WorkerPids(id).empty(); }, absl::Seconds(30)));
  EXPECT_EQ(testing::ListCheckpoints(*stub_, id).back().kind(), v1::CHECKPOINT_KIND_SHUTDOWN);
  EXPECT_EQ(WaitForEnd(urgent).state(), v1::JOB_STATE_SUCCEEDED);
  const v1::Job resumed = WaitForEnd(id);
  ASSERT_EQ(resumed.state(), v1::JOB_STATE_SUCCEEDED) << resumed.reason();
  EXPECT_EQ(resumed.attempts(), 2);
  EXPECT_EQ(resumed.global_step(), uninterrupted.global_step());
  EXPECT_EQ(resumed.last_epoch().train_loss(), uninterrupted.last_epoch().train_loss());
  EXPECT_EQ(resumed.last_epoch().test_loss(), uninterrupted.last_epoch().test_loss());
}

// A resumed attempt must not take its first epoch for the best so far: kilnd tells its workers
// the job's best, which their "best" checkpoints (keep_best) must beat.
TEST_F(WorkerJobsTest, AResumedAttemptTellsItsWorkersTheJobsBestAccuracy) {
  ASSERT_NO_FATAL_FAILURE(StartKilnd());
  v1::JobSpec spec = Workers(2, 1);
  spec.set_external_workers(true);
  const std::string id = testing::SubmitJob(*stub_, spec);
  grpc::ClientContext token_context;
  v1::GetWorkerTokenRequest token_request;
  token_request.set_job_id(id);
  v1::GetWorkerTokenResponse token;
  ASSERT_OK(stub_->GetWorkerToken(&token_context, token_request, &token));
  const std::string worker = (fs::path(KILND_PATH).parent_path() / "kiln-worker").string();
  std::vector<std::unique_ptr<kiln::testing::Subprocess>> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.push_back(std::make_unique<kiln::testing::Subprocess>());
    ASSERT_TRUE(ranks.back()->Start({worker, "--coordinator", kilnd_->address(), "--job", id,
                                     "--rank", absl::StrCat(rank), "--data_dir", root_ + "/data"},
                                    {"KILN_WORKER_TOKEN=" + token.token()}));
  }
  for (auto& r : ranks) EXPECT_EQ(r->Wait(kWait), 0);
  const v1::Job first = WaitForEnd(id);
  ASSERT_EQ(first.state(), v1::JOB_STATE_SUCCEEDED) << first.reason();
  ASSERT_GT(first.best_test_accuracy(), 0);

  grpc::ClientContext resume_context;
  v1::ResumeJobRequest resume;
  resume.set_job_id(id);
  resume.set_epochs(2);
  v1::Job resumed;
  ASSERT_OK(stub_->ResumeJob(&resume_context, resume, &resumed));
  // Joining as rank 0 of the new attempt, as a worker would.
  auto workers = v1::Workers::NewStub(channel_);
  v1::JoinJobResponse joined;
  ASSERT_TRUE(WaitFor(
      [&] {
        grpc::ClientContext context;
        context.AddMetadata("x-kiln-worker-token", token.token());
        v1::JoinJobRequest join;
        join.set_job_id(id);
        join.set_rank(0);
        return workers->JoinJob(&context, join, &joined).ok();
      },
      kWait));
  EXPECT_EQ(joined.attempt(), 2);
  EXPECT_EQ(joined.epochs(), 2);
  EXPECT_DOUBLE_EQ(joined.best_test_accuracy(), first.best_test_accuracy());
  EXPECT_GT(joined.resume_from().id(), 0);
  grpc::ClientContext cancel_context;
  v1::CancelJobRequest cancel;
  cancel.set_job_id(id);
  v1::Job ignored;
  ASSERT_OK(stub_->CancelJob(&cancel_context, cancel, &ignored));
  EXPECT_EQ(WaitForEnd(id).state(), v1::JOB_STATE_CANCELLED);
}

}  // namespace
}  // namespace kiln::server
