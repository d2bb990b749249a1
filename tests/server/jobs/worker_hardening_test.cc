// The Workers service against a hostile holder of a job's worker token: whatever it sends fails
// at most that job's attempt, with a reason naming the rank and what was wrong, and never
// crashes, bricks or exhausts kilnd. A kilnd subprocess runs jobs of external workers; the test
// speaks kiln.v1.Workers to it as a worker would, and as one should not.
#include <grpcpp/grpcpp.h>

#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/sha256.h"
#include "engine/backend_registry.h"
#include "engine/model/checkpoint.h"
#include "engine/model/model.h"
#include "engine/optim/optimizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/v1/worker.grpc.pb.h"
#include "server/datasets/dataset_catalog.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/job_store.h"
#include "server/jobs/metric_broadcaster.h"
#include "server/jobs/spec_translation.h"
#include "server/jobs/worker_attempt.h"
#include "server_test_support.h"
#include "tests/support/connected_channel.h"
#include "tests/support/status_matchers.h"

namespace kiln::server {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(60);
constexpr char kTokenHeader[] = "x-kiln-worker-token";
// The toy dataset's 256 training samples in batches of 32.
constexpr int kStepsPerEpoch = 8;

// A step as rank `rank` of 2 would report it at `global_step` of a 1-epoch job.
v1::WorkerReport GoodStep(int64_t global_step) {
  v1::WorkerReport r;
  v1::WorkerStep* step = r.mutable_step();
  v1::StepMetrics* m = step->mutable_metrics();
  m->set_epoch(1);
  m->set_step_in_epoch(static_cast<int32_t>(global_step));
  m->set_steps_per_epoch(kStepsPerEpoch);
  m->set_global_step(global_step);
  m->set_loss(2.3f);
  m->set_lr(0.05f);
  m->set_samples_per_sec(1000);
  step->set_samples(32);
  step->set_seconds(0.05);
  step->set_rank_samples(16);
  step->set_allreduce_seconds(0.001);
  step->set_allreduce_bytes(100'000);
  return r;
}

v1::WorkerReport GoodEpoch() {
  v1::WorkerReport r;
  v1::EpochMetrics* m = r.mutable_epoch()->mutable_metrics();
  m->set_epoch(1);
  m->set_train_loss(1.5);
  m->set_train_accuracy(0.5);
  m->set_test_loss(1.6);
  m->set_test_accuracy(0.4);
  m->set_test_samples(64);
  m->set_train_seconds(2);
  m->set_samples_per_sec(128);
  m->set_lr(0.05f);
  return r;
}

class HostileWorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::MakeTempDir("hostile-worker");
    testing::WriteToyDataset(root_ + "/data/toy", 256, 64);
  }
  void TearDown() override {
    kilnd_.reset();
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  void StartKilnd(std::vector<std::string> args = {}) {
    kilnd_ =
        std::make_unique<testing::KilndProcess>(root_ + "/state", root_ + "/data", std::move(args));
    ASSERT_TRUE(kilnd_->Start()) << kilnd_->Stderr();
    training_ = kilnd_->NewStub();
    workers_ = v1::Workers::NewStub(kiln::testing::ConnectedChannel(kilnd_->address()));
  }
  // A job of two external workers, RUNNING and taking workers; its token in *token.
  std::string SubmitExternal(int epochs, std::string* token) {
    v1::JobSpec spec = testing::SmallSpec("toy", epochs);
    spec.set_workers(2);
    spec.set_external_workers(true);
    const std::string id = testing::SubmitJob(*training_, spec);
    grpc::ClientContext context;
    v1::GetWorkerTokenRequest request;
    request.set_job_id(id);
    v1::GetWorkerTokenResponse response;
    EXPECT_OK(training_->GetWorkerToken(&context, request, &response));
    *token = response.token();
    // RUNNING is announced a moment before the attempt takes workers.
    EXPECT_TRUE(testing::WaitFor(
        [&] {
          grpc::ClientContext c;
          c.AddMetadata(kTokenHeader, *token);
          v1::GetKeyRequest get;
          get.set_job_id(id);
          get.set_key("probe");
          v1::GetKeyResponse ignored;
          return workers_->GetKey(&c, get, &ignored).error_code() !=
                 grpc::StatusCode::FAILED_PRECONDITION;
        },
        kWait));
    return id;
  }
  std::unique_ptr<grpc::ClientContext> Context(const std::string& token) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->AddMetadata(kTokenHeader, token);
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    return context;
  }
  v1::JoinJobResponse Join(const std::string& job, const std::string& token, int rank) {
    auto context = Context(token);
    v1::JoinJobRequest request;
    request.set_job_id(job);
    request.set_rank(rank);
    v1::JoinJobResponse joined;
    EXPECT_OK(workers_->JoinJob(context.get(), request, &joined));
    return joined;
  }
  // A Report stream of `rank`, its hello sent.
  struct ReportCall {
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerReport, v1::WorkerCommand>> stream;
  };
  ReportCall OpenReport(const std::string& job, const std::string& token, int rank,
                        const v1::JoinJobResponse& joined) {
    ReportCall call;
    call.context = Context(token);
    call.stream = workers_->Report(call.context.get());
    v1::WorkerReport hello;
    hello.mutable_hello()->set_rank(rank);
    hello.mutable_hello()->set_job_id(job);
    hello.mutable_hello()->set_rank_token(joined.rank_token());
    EXPECT_TRUE(call.stream->Write(hello));
    return call;
  }
  v1::Job WaitForEnd(const std::string& id, absl::Duration timeout = kWait) {
    v1::Job job;
    testing::WaitFor(
        [&] {
          job = testing::GetJob(*training_, id);
          return job.state() == v1::JOB_STATE_SUCCEEDED || job.state() == v1::JOB_STATE_FAILED ||
                 job.state() == v1::JOB_STATE_CANCELLED;
        },
        timeout);
    return job;
  }

  std::string root_;
  std::unique_ptr<testing::KilndProcess> kilnd_;
  std::unique_ptr<v1::Training::Stub> training_;
  std::unique_ptr<v1::Workers::Stub> workers_;
};

// One hostile report: which rank sends it, what it is, and what the job's reason must name.
struct BadReport {
  std::string name;
  int rank;
  std::function<void(v1::WorkerReport*)> spoil;
  std::vector<std::string> reason;
};

TEST_F(HostileWorkerTest, EveryFieldOfAReportIsCheckedAndABadOneFailsTheAttemptNamingIt) {
  ASSERT_NO_FATAL_FAILURE(StartKilnd());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  auto step = [](std::function<void(v1::WorkerStep*)> f) {
    return [f](v1::WorkerReport* r) {
      *r = GoodStep(1);
      f(r->mutable_step());
    };
  };
  auto epoch = [](std::function<void(v1::EpochMetrics*)> f) {
    return [f](v1::WorkerReport* r) {
      *r = GoodEpoch();
      f(r->mutable_epoch()->mutable_metrics());
    };
  };
  const std::vector<BadReport> cases = {
      {"global_step INT64_MIN",
       1,
       step([](v1::WorkerStep* s) { s->mutable_metrics()->set_global_step(INT64_MIN); }),
       {"rank 1", "global_step"}},
      {"global_step past the plan",
       0,
       step([](v1::WorkerStep* s) { s->mutable_metrics()->set_global_step(9); }),
       {"rank 0", "global_step"}},
      {"epoch 0",
       0,
       step([](v1::WorkerStep* s) { s->mutable_metrics()->set_epoch(0); }),
       {"rank 0", "step.metrics.epoch"}},
      {"epoch past the job's",
       1,
       step([](v1::WorkerStep* s) { s->mutable_metrics()->set_epoch(2); }),
       {"rank 1", "step.metrics.epoch"}},
      {"step_in_epoch 0",
       0,
       step([](v1::WorkerStep* s) { s->mutable_metrics()->set_step_in_epoch(0); }),
       {"rank 0", "step_in_epoch"}},
      {"step_in_epoch past the epoch",
       0,
       step([](v1::WorkerStep* s) { s->mutable_metrics()->set_step_in_epoch(9); }),
       {"rank 0", "step_in_epoch"}},
      {"steps_per_epoch not the dataset's",
       0,
       step([](v1::WorkerStep* s) { s->mutable_metrics()->set_steps_per_epoch(1'000'000); }),
       {"rank 0", "steps_per_epoch"}},
      {"NaN loss",
       0,
       step([nan](v1::WorkerStep* s) { s->mutable_metrics()->set_loss(nan); }),
       {"rank 0: loss became NaN at epoch 1 step 1"}},
      {"infinite loss",
       1,
       step([](v1::WorkerStep* s) { s->mutable_metrics()->set_loss(HUGE_VALF); }),
       {"rank 1: loss became Inf at epoch 1 step 1"}},
      {"NaN lr",
       0,
       step([nan](v1::WorkerStep* s) { s->mutable_metrics()->set_lr(nan); }),
       {"rank 0", "step.metrics.lr"}},
      {"negative lr",
       0,
       step([](v1::WorkerStep* s) { s->mutable_metrics()->set_lr(-1); }),
       {"rank 0", "step.metrics.lr"}},
      {"infinite samples_per_sec",
       0,
       step([inf](v1::WorkerStep* s) { s->mutable_metrics()->set_samples_per_sec(inf); }),
       {"rank 0", "samples_per_sec"}},
      {"samples over the batch",
       0,
       step([](v1::WorkerStep* s) { s->set_samples(33); }),
       {"rank 0", "step.samples"}},
      {"rank_samples over the batch",
       1,
       step([](v1::WorkerStep* s) { s->set_rank_samples(33); }),
       {"rank 1", "step.rank_samples"}},
      {"negative seconds",
       1,
       step([](v1::WorkerStep* s) { s->set_seconds(-1); }),
       {"rank 1", "step.seconds"}},
      {"NaN allreduce_seconds",
       1,
       step([](v1::WorkerStep* s) { s->set_allreduce_seconds(std::nan("")); }),
       {"rank 1", "step.allreduce_seconds"}},
      {"negative allreduce_bytes",
       1,
       step([](v1::WorkerStep* s) { s->set_allreduce_bytes(-1); }),
       {"rank 1", "step.allreduce_bytes"}},
      {"epoch 20000 of 1",
       0,
       epoch([](v1::EpochMetrics* m) { m->set_epoch(20'000); }),
       {"rank 0", "epoch.metrics.epoch"}},
      {"epoch accuracy over 1",
       0,
       epoch([](v1::EpochMetrics* m) { m->set_train_accuracy(1.5); }),
       {"rank 0", "train_accuracy"}},
      {"epoch NaN test loss",
       0,
       epoch([](v1::EpochMetrics* m) { m->set_test_loss(std::nan("")); }),
       {"rank 0", "test_loss"}},
      {"epoch negative test samples",
       0,
       epoch([](v1::EpochMetrics* m) { m->set_test_samples(-1); }),
       {"rank 0", "test_samples"}},
      {"epoch infinite seconds",
       0,
       epoch([inf](v1::EpochMetrics* m) { m->set_train_seconds(inf); }),
       {"rank 0", "train_seconds"}},
      {"an empty report", 1, [](v1::WorkerReport* r) { r->Clear(); }, {"rank 1", "empty"}},
      {"a huge failure message",
       1,
       [](v1::WorkerReport* r) {
         r->mutable_failed()->set_code(13);
         r->mutable_failed()->set_message(std::string(1 << 20, 'x'));
       },
       {"cut short"}},
  };
  for (const BadReport& c : cases) {
    SCOPED_TRACE(c.name);
    std::string token;
    const std::string job = SubmitExternal(1, &token);
    const v1::JoinJobResponse zero = Join(job, token, 0);
    const v1::JoinJobResponse one = Join(job, token, 1);
    ReportCall calls[2] = {OpenReport(job, token, 0, zero), OpenReport(job, token, 1, one)};
    v1::WorkerReport report;
    c.spoil(&report);
    calls[c.rank].stream->Write(report);
    const v1::Job ended = WaitForEnd(job, absl::Seconds(15));
    EXPECT_EQ(ended.state(), v1::JOB_STATE_FAILED) << ended.reason();
    for (const std::string& part : c.reason) EXPECT_THAT(ended.reason(), HasSubstr(part));
    EXPECT_LT(ended.reason().size(), 2048u);
    for (ReportCall& call : calls) call.context->TryCancel();
  }
}

TEST_F(HostileWorkerTest, StepsMustMoveForwardAndStayWithinTheJobsSteps) {
  ASSERT_NO_FATAL_FAILURE(StartKilnd());
  std::string token;
  const std::string job = SubmitExternal(1, &token);
  const v1::JoinJobResponse zero = Join(job, token, 0);
  ReportCall call = OpenReport(job, token, 0, zero);
  ASSERT_TRUE(call.stream->Write(GoodStep(1)));
  ASSERT_TRUE(call.stream->Write(GoodStep(2)));
  call.stream->Write(GoodStep(2));  // again
  const v1::Job ended = WaitForEnd(job, absl::Seconds(15));
  EXPECT_EQ(ended.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(ended.reason(), HasSubstr("rank 0"));
  EXPECT_THAT(ended.reason(), HasSubstr("global_step 2"));
  EXPECT_EQ(ended.global_step(), 2);
  call.context->TryCancel();
}

// What the hostile test did: a step numbered INT64_MIN, then enough steps to thin the history.
// Before reports were checked, the thinning overflowed (abs(INT64_MIN)), failing the job and every
// later start of kilnd.
TEST_F(HostileWorkerTest, AStepNumberedInt64MinNeitherBricksTheStoreNorKilnd) {
  ASSERT_NO_FATAL_FAILURE(StartKilnd({"--max_step_events_per_job=100"}));
  std::string token;
  const std::string job = SubmitExternal(1, &token);
  const v1::JoinJobResponse zero = Join(job, token, 0);
  ReportCall call = OpenReport(job, token, 0, zero);
  v1::WorkerReport bad = GoodStep(1);
  bad.mutable_step()->mutable_metrics()->set_global_step(INT64_MIN);
  call.stream->Write(bad);
  for (int i = 1; i <= 150; ++i) {
    if (!call.stream->Write(GoodStep(i))) break;
  }
  const v1::Job ended = WaitForEnd(job);
  EXPECT_EQ(ended.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(ended.reason(), HasSubstr("rank 0"));
  EXPECT_THAT(ended.reason(), HasSubstr("global_step -9223372036854775808"));
  call.context->TryCancel();
  ASSERT_EQ(kilnd_->Stop(SIGTERM, absl::Seconds(60)), 0);
  ASSERT_NO_FATAL_FAILURE(StartKilnd({"--max_step_events_per_job=100"}));
  EXPECT_EQ(testing::GetJob(*training_, job).state(), v1::JOB_STATE_FAILED);
}

// Workers that join and never report kept a job RUNNING, and its device busy, for ever.
TEST(SilentWorkerTest, ARankThatSendsNothingFailsTheAttemptNamingIt) {
  const std::string root = testing::MakeTempDir("silent-worker");
  fs::create_directories(root + "/state");
  testing::WriteToyDataset(root + "/data/toy", 256, 64);
  {
    auto store = JobStore::Open(root + "/state/kiln.db");
    ASSERT_OK(store);
    MetricBroadcaster broadcaster(16);
    DatasetCatalog catalog(root + "/data", int64_t{1} << 30);
    WorkerRegistry registry(std::string(32, 'k'));
    JobManagerOptions options;
    options.state_dir = root + "/state";
    options.workers.registry = &registry;
    options.workers.worker_binary = "/bin/false";
    options.workers.state_dir = options.state_dir;
    options.workers.heartbeat_timeout = absl::Milliseconds(500);
    JobManager manager(store->get(), &broadcaster, &catalog, options);
    ASSERT_OK(manager.Recover());
    v1::JobSpec spec = testing::SmallSpec("toy", 1);
    spec.set_workers(2);
    spec.set_external_workers(true);
    absl::StatusOr<v1::Job> job = manager.Submit(spec);
    ASSERT_OK(job);
    std::shared_ptr<WorkerAttempt> attempt;
    ASSERT_TRUE(testing::WaitFor(
        [&] {
          absl::StatusOr<std::shared_ptr<WorkerAttempt>> found =
              registry.Find(job->id(), registry.TokenFor(job->id()));
          if (found.ok()) attempt = *found;
          return found.ok();
        },
        kWait));
    // Rank 1 reports a step now and then; rank 0 joins, says hello, and is never heard again.
    absl::StatusOr<v1::JoinJobResponse> zero = attempt->Join(0, "a");
    absl::StatusOr<v1::JoinJobResponse> one = attempt->Join(1, "b");
    ASSERT_OK(zero);
    ASSERT_OK(one);
    v1::WorkerReport hello;
    hello.mutable_hello()->set_job_id(job->id());
    ASSERT_OK(attempt->Report(0, hello));
    ASSERT_OK(attempt->Report(1, hello));
    EXPECT_GT(zero->keep_alive_interval_ms(), 0);
    EXPECT_LT(zero->keep_alive_interval_ms(), 500);
    v1::WorkerReport keep_alive;
    keep_alive.mutable_keep_alive();
    v1::Job seen;
    const absl::Time start = absl::Now();
    ASSERT_TRUE(testing::WaitFor(
        [&] {
          attempt->Report(1, keep_alive).IgnoreError();
          seen = *manager.Get(job->id());
          return seen.state() == v1::JOB_STATE_FAILED;
        },
        absl::Seconds(20)));
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
    EXPECT_THAT(seen.reason(), HasSubstr("worker rank 0 sent no report"));
    EXPECT_THAT(seen.reason(), HasSubstr("--worker_heartbeat_timeout"));
    EXPECT_THAT(seen.reason(), ::testing::Not(HasSubstr("rank 1")));
  }
  std::error_code ec;
  fs::remove_all(root, ec);
}

// An honest worker whose steps are slower than the heartbeat keeps its attempt alive with
// keep-alives.
TEST_F(HostileWorkerTest, ASlowWorkerStaysAliveWithKeepAlives) {
  ASSERT_NO_FATAL_FAILURE(StartKilnd({"--worker_heartbeat_timeout=1s", "--step_delay=1500ms"}));
  v1::JobSpec spec = testing::SmallSpec("toy", 1);
  spec.set_workers(2);
  const std::string id = testing::SubmitJob(*training_, spec);
  const v1::Job job = WaitForEnd(id, absl::Seconds(120));
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
}

TEST(WorkerLimitFlagsTest, LimitsBelowOneStopKilndAtStartNamingTheFlag) {
  const std::string root = testing::MakeTempDir("worker-limit-flags");
  for (const char* flag : {"--max_rendezvous_waiters_per_job=0", "--max_rendezvous_bytes_per_job=0",
                           "--max_rendezvous_bytes=0", "--worker_heartbeat_timeout=0s"}) {
    SCOPED_TRACE(flag);
    testing::KilndProcess kilnd(root + "/state", root + "/data", {flag});
    EXPECT_FALSE(kilnd.Start());
    const std::string name = std::string(flag).substr(0, std::string(flag).find('='));
    EXPECT_THAT(kilnd.Stderr(), HasSubstr(name + ": must be at least"));
  }
  std::error_code ec;
  fs::remove_all(root, ec);
}

// Threads of process `pid` now (/proc/PID/status).
int ThreadsOf(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "Threads:")) return std::stoi(line.substr(8));
  }
  return -1;
}

// GetKey calls in flight, made with gRPC's callback client: each waits for a key never set.
class WaitingGets {
 public:
  WaitingGets(v1::Workers::Stub* stub, const std::string& job, const std::string& token, int n) {
    calls_.resize(n);
    for (int i = 0; i < n; ++i) {
      Call& c = calls_[i];
      c.context.AddMetadata(kTokenHeader, token);
      c.request.set_job_id(job);
      c.request.set_key(absl::StrCat("never-", i));
      c.request.set_timeout_ms(10 * 60 * 1000);
      stub->async()->GetKey(&c.context, &c.request, &c.response, [this, &c](grpc::Status s) {
        std::lock_guard<std::mutex> lock(mu_);
        c.status = std::move(s);
        c.done = true;
        ++done_;
        cv_.notify_all();
      });
    }
  }
  ~WaitingGets() {
    CancelAll();
    WaitForAll(absl::Minutes(1));
  }
  void CancelAll() {
    for (Call& c : calls_) c.context.TryCancel();
  }
  bool WaitFor(int done, absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] { return done_ >= done; });
  }
  bool WaitForAll(absl::Duration timeout) {
    return WaitFor(static_cast<int>(calls_.size()), timeout);
  }
  // The ended calls' status codes, counted.
  std::map<grpc::StatusCode, int> Codes(std::string* a_message = nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    std::map<grpc::StatusCode, int> codes;
    for (const Call& c : calls_) {
      if (!c.done) continue;
      ++codes[c.status.error_code()];
      if (a_message != nullptr && !c.status.ok()) *a_message = c.status.error_message();
    }
    return codes;
  }
  int done() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }

 private:
  struct Call {
    grpc::ClientContext context;
    v1::GetKeyRequest request;
    v1::GetKeyResponse response;
    grpc::Status status;
    bool done = false;
  };
  std::deque<Call> calls_;
  std::mutex mu_;
  std::condition_variable cv_;
  int done_ = 0;
};

TEST(WorkerAttemptLimitsTest, RendezvousWaitsAreCappedAndACancelledOneFreesItsPlace) {
  v1::JoinJobResponse join;
  join.set_attempt(1);
  join.set_world_size(2);
  WorkerLimits limits;
  limits.max_key_waiters_per_job = 2;
  WorkerAttempt attempt("job-1", join, {"cpu", "cpu"}, {}, limits);
  std::vector<std::string> got;
  auto collect = [&](absl::StatusOr<std::string> v) {
    got.push_back(v.ok() ? *v : std::string(v.status().message()));
  };
  absl::StatusOr<int64_t> first = attempt.WaitForKey("a", collect);
  absl::StatusOr<int64_t> second = attempt.WaitForKey("b", collect);
  ASSERT_OK(first);
  ASSERT_OK(second);
  absl::StatusOr<int64_t> third = attempt.WaitForKey("c", collect);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(), HasSubstr("--max_rendezvous_waiters_per_job=2"));
  attempt.CancelKeyWait(*first);
  third = attempt.WaitForKey("c", collect);
  ASSERT_OK(third);
  ASSERT_OK(attempt.SetKey("c", "value of c"));
  ASSERT_OK(attempt.SetKey("a", "value of a"));  // its wait was cancelled: nobody hears
  EXPECT_EQ(got, std::vector<std::string>{"value of c"});
  // A key that is there needs no place.
  ASSERT_OK(attempt.WaitForKey("zz", collect).status());
  ASSERT_OK(attempt.SetKey("zz", "x"));
  EXPECT_EQ(*attempt.WaitForKey("a", collect), 0) << "answered at once";
  EXPECT_EQ(got.back(), "value of a");
  attempt.End();
  EXPECT_EQ(got.back(), "the attempt has ended") << "the wait for b ends with the attempt";
}

// Each waiting GetKey held a server thread for up to 10 minutes, cancelled or not: 3,000 calls
// made 3,033 threads. A wait now holds no thread, and a cancelled one ends at once.
TEST_F(HostileWorkerTest, RendezvousWaitsHoldNoThreadAndEndWhenCancelled) {
  ASSERT_NO_FATAL_FAILURE(StartKilnd());
  std::string token;
  const std::string job = SubmitExternal(1, &token);
  const int before = ThreadsOf(kilnd_->pid());
  {
    WaitingGets gets(workers_.get(), job, token, 200);
    absl::SleepFor(absl::Seconds(2));  // every call has reached kilnd and waits
    EXPECT_EQ(gets.done(), 0) << "a wait ended early";
    EXPECT_LT(ThreadsOf(kilnd_->pid()), before + 50) << "waits hold threads";
    gets.CancelAll();
    EXPECT_TRUE(gets.WaitForAll(absl::Seconds(10)));
    EXPECT_EQ(gets.Codes()[grpc::StatusCode::CANCELLED], 200);
  }
  // The server's side of each cancelled wait is gone too: kilnd's threads are back.
  EXPECT_TRUE(
      testing::WaitFor([&] { return ThreadsOf(kilnd_->pid()) < before + 20; }, absl::Seconds(10)))
      << ThreadsOf(kilnd_->pid()) << " threads, " << before << " before the waits";
  // And the store still serves.
  auto context = Context(token);
  v1::SetKeyRequest set;
  set.set_job_id(job);
  set.set_key("k");
  set.set_value("v");
  v1::SetKeyResponse set_response;
  ASSERT_OK(workers_->SetKey(context.get(), set, &set_response));
  context = Context(token);
  v1::GetKeyRequest get;
  get.set_job_id(job);
  get.set_key("k");
  get.set_timeout_ms(1000);
  v1::GetKeyResponse got;
  ASSERT_OK(workers_->GetKey(context.get(), get, &got));
  EXPECT_EQ(got.value(), "v");
}

TEST_F(HostileWorkerTest, RendezvousWaitersPerJobAreCapped) {
  ASSERT_NO_FATAL_FAILURE(StartKilnd());
  std::string token;
  const std::string job = SubmitExternal(1, &token);
  WaitingGets gets(workers_.get(), job, token, 300);
  ASSERT_TRUE(gets.WaitFor(44, absl::Seconds(30)));
  absl::SleepFor(absl::Milliseconds(500));
  std::string message;
  std::map<grpc::StatusCode, int> codes = gets.Codes(&message);
  EXPECT_EQ(codes[grpc::StatusCode::RESOURCE_EXHAUSTED], 44);
  EXPECT_EQ(gets.done(), 44) << "256 wait";
  EXPECT_THAT(message, HasSubstr("256"));
  EXPECT_THAT(message, HasSubstr("--max_rendezvous_waiters_per_job"));
  // The attempt's end ends the waits, at once.
  grpc::ClientContext cancel_context;
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job);
  v1::Job ignored;
  ASSERT_OK(training_->CancelJob(&cancel_context, cancel, &ignored));
  EXPECT_TRUE(gets.WaitForAll(absl::Seconds(10)));
  codes = gets.Codes();
  EXPECT_EQ(codes[grpc::StatusCode::ABORTED], 256);
}

grpc::Status SetKey(v1::Workers::Stub& stub, const std::string& job, const std::string& token,
                    const std::string& key, const std::string& value) {
  grpc::ClientContext context;
  context.AddMetadata(kTokenHeader, token);
  v1::SetKeyRequest request;
  request.set_job_id(job);
  request.set_key(key);
  request.set_value(value);
  v1::SetKeyResponse response;
  return stub.SetKey(&context, request, &response);
}

// Rendezvous keys took 4,096 x 1 MiB an attempt (4 GiB a job) with no total: two jobs took 2 GB
// of kilnd's memory in 10 s. A job's keys now fit its budget.
TEST_F(HostileWorkerTest, RendezvousKeysOfAJobFitItsByteBudget) {
  ASSERT_NO_FATAL_FAILURE(StartKilnd());
  std::string token;
  const std::string job = SubmitExternal(1, &token);
  const std::string mib(1 << 20, 'x');
  int stored = 0;
  grpc::Status refused;
  for (int i = 0; i < 64 && refused.ok(); ++i) {
    refused = SetKey(*workers_, job, token, absl::StrCat("k", i), mib);
    stored += refused.ok();
  }
  EXPECT_EQ(stored, 15) << "16 MiB a job, keys and values";
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("--max_rendezvous_bytes_per_job"));
  // A key replaced by a smaller value gives its bytes back.
  ASSERT_OK(SetKey(*workers_, job, token, "k0", "small"));
  EXPECT_OK(SetKey(*workers_, job, token, "k-new", mib));
}

TEST_F(HostileWorkerTest, RendezvousKeysOfAllJobsFitKilndsByteBudget) {
  ASSERT_NO_FATAL_FAILURE(
      StartKilnd({"--max_rendezvous_bytes=20000000", "--max_jobs_per_device=2"}));
  std::string token_a, token_b;
  const std::string a = SubmitExternal(1, &token_a);
  const std::string b = SubmitExternal(1, &token_b);
  const std::string mib(1 << 20, 'x');
  for (int i = 0; i < 12; ++i) ASSERT_OK(SetKey(*workers_, a, token_a, absl::StrCat("k", i), mib));
  grpc::Status refused;
  int stored = 0;
  for (int i = 0; i < 12 && refused.ok(); ++i) {
    refused = SetKey(*workers_, b, token_b, absl::StrCat("k", i), mib);
    stored += refused.ok();
  }
  EXPECT_EQ(stored, 7) << "20,000,000 bytes in all";
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("--max_rendezvous_bytes"));
  // An attempt's keys go with it, and their bytes back to kilnd.
  grpc::ClientContext cancel_context;
  v1::CancelJobRequest cancel;
  cancel.set_job_id(a);
  v1::Job ignored;
  ASSERT_OK(training_->CancelJob(&cancel_context, cancel, &ignored));
  ASSERT_EQ(WaitForEnd(a).state(), v1::JOB_STATE_CANCELLED);
  EXPECT_OK(SetKey(*workers_, b, token_b, "after", mib));
}

// A checkpoint file of `spec`'s model (or another's) at a position, as a run writes it.
std::string CheckpointFile(const std::string& dir, const v1::JobSpec& spec, int epochs_done,
                           int64_t global_step) {
  absl::StatusOr<TrainConfig> config = TranslateSpec(spec, SpecLimits{});
  EXPECT_OK(config);
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend("cpu");
  EXPECT_OK(backend);
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Build(config->model, backend->get(), 7);
  EXPECT_OK(model);
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
      Optimizer::Create(config->optimizer, backend->get(), (*model)->parameters());
  EXPECT_OK(optimizer);
  TrainingPosition position;
  position.epochs_done = epochs_done;
  position.global_step = global_step;
  const std::string path = absl::StrCat(dir, "/made-", epochs_done, "-", global_step, "-",
                                        spec.model().layers_size(), ".safetensors");
  EXPECT_OK(WriteCheckpoint(path, **model, optimizer->get(), position, config->norm));
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

v1::WriteCheckpointHeader Header(const std::string& job, v1::CheckpointKind kind, int epochs_done,
                                 int64_t global_step, const std::string& bytes) {
  v1::WriteCheckpointHeader header;
  header.set_job_id(job);
  header.set_kind(kind);
  header.set_epochs_done(epochs_done);
  header.set_global_step(global_step);
  header.set_size_bytes(static_cast<int64_t>(bytes.size()));
  Sha256 sha;
  sha.Update(bytes);
  header.set_sha256(sha.HexDigest());
  return header;
}

grpc::Status WriteCheckpointCall(v1::Workers::Stub& stub, const std::string& token,
                                 const v1::WriteCheckpointHeader& header, const std::string& bytes,
                                 v1::Checkpoint* record = nullptr) {
  grpc::ClientContext context;
  context.AddMetadata(kTokenHeader, token);
  v1::Checkpoint ignored;
  auto writer = stub.WriteCheckpoint(&context, record != nullptr ? record : &ignored);
  v1::WriteCheckpointRequest request;
  *request.mutable_header() = header;
  for (size_t at = 0; at == 0 || at < bytes.size(); at += 1 << 20) {
    request.set_data(bytes.substr(at, 1 << 20));
    if (!writer->Write(request)) break;
    request.clear_header();
  }
  writer->WritesDone();
  return writer->Finish();
}

// Files under the job's checkpoint folder.
int FilesOf(const std::string& dir) {
  std::error_code ec;
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) n += e.is_regular_file() ? 1 : 0;
  return n;
}

// WriteCheckpoint trusted any holder of the job's token: any rank, joined or not, any kind and
// step, any bytes. Only rank 0 of the running attempt hands checkpoints over.
TEST_F(HostileWorkerTest, OnlyRankZeroOfTheAttemptHandsOverCheckpoints) {
  ASSERT_NO_FATAL_FAILURE(StartKilnd());
  std::string token;
  const std::string job = SubmitExternal(1, &token);
  const v1::JoinJobResponse zero = Join(job, token, 0);
  const v1::JoinJobResponse one = Join(job, token, 1);
  const std::string bytes(1 << 20, 'x');
  v1::WriteCheckpointHeader header = Header(job, v1::CHECKPOINT_KIND_ON_DEMAND, 0, 1, bytes);
  grpc::Status status = WriteCheckpointCall(*workers_, token, header, bytes);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("rank token"));
  header.set_rank_token(one.rank_token());
  status = WriteCheckpointCall(*workers_, token, header, bytes);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("only rank 0"));
  EXPECT_TRUE(testing::ListCheckpoints(*training_, job).empty());
  EXPECT_EQ(FilesOf(root_ + "/state/checkpoints/" + job), 0);
  // Nor does a report stream speak for rank 0 without its token.
  v1::JoinJobResponse forged = zero;
  forged.set_rank_token(one.rank_token());
  ReportCall call = OpenReport(job, token, 0, forged);
  call.stream->WritesDone();
  status = call.stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
  EXPECT_EQ(testing::GetJob(*training_, job).state(), v1::JOB_STATE_RUNNING)
      << "a stranger's stream fails nothing";
}

TEST_F(HostileWorkerTest, ACheckpointIsOneTheRunWritesInThePlanAndOfTheJobsModel) {
  ASSERT_NO_FATAL_FAILURE(StartKilnd());
  std::string token;
  const std::string job = SubmitExternal(1, &token);
  const v1::JoinJobResponse zero = Join(job, token, 0);
  const std::string dir = root_ + "/made";
  fs::create_directories(dir);
  const v1::JobSpec spec = testing::SmallSpec("toy", 1);
  const std::string final_file = CheckpointFile(dir, spec, 1, 8);
  auto write = [&](v1::CheckpointKind kind, int epochs_done, int64_t step, const std::string& bytes,
                   v1::Checkpoint* record = nullptr) {
    v1::WriteCheckpointHeader header = Header(job, kind, epochs_done, step, bytes);
    header.set_rank_token(zero.rank_token());
    return WriteCheckpointCall(*workers_, token, header, bytes, record);
  };
  struct Refused {
    const char* name;
    grpc::Status status;
    grpc::StatusCode code;
    const char* says;
  };
  v1::JobSpec other = spec;
  other.mutable_model()->mutable_layers(0)->mutable_linear()->set_out_features(16);
  other.mutable_model()->mutable_layers(2)->mutable_linear()->set_in_features(16);
  std::string truncated = final_file.substr(0, final_file.size() - 100);
  const Refused cases[] = {
      {"no kind", write(v1::CHECKPOINT_KIND_UNSPECIFIED, 1, 8, final_file),
       grpc::StatusCode::INVALID_ARGUMENT, "kind"},
      {"an unknown kind", write(static_cast<v1::CheckpointKind>(99), 1, 8, final_file),
       grpc::StatusCode::INVALID_ARGUMENT, "kind"},
      {"on demand, asked by nobody", write(v1::CHECKPOINT_KIND_ON_DEMAND, 1, 8, final_file),
       grpc::StatusCode::FAILED_PRECONDITION, "asked"},
      {"periodic, without every_n_epochs", write(v1::CHECKPOINT_KIND_PERIODIC, 1, 8, final_file),
       grpc::StatusCode::FAILED_PRECONDITION, "every_n_epochs"},
      {"a shutdown, with none", write(v1::CHECKPOINT_KIND_SHUTDOWN, 1, 8, final_file),
       grpc::StatusCode::FAILED_PRECONDITION, "shutdown"},
      {"final, before the last epoch", write(v1::CHECKPOINT_KIND_FINAL, 0, 8, final_file),
       grpc::StatusCode::FAILED_PRECONDITION, "epochs_done"},
      {"a step past the plan", write(v1::CHECKPOINT_KIND_FINAL, 1, 9, final_file),
       grpc::StatusCode::INVALID_ARGUMENT, "global_step 9"},
      {"epochs past the plan", write(v1::CHECKPOINT_KIND_FINAL, 2, 8, final_file),
       grpc::StatusCode::INVALID_ARGUMENT, "epochs_done 2"},
      {"larger than the model's checkpoint can be",
       [&] {
         v1::WriteCheckpointHeader h = Header(job, v1::CHECKPOINT_KIND_FINAL, 1, 8, "");
         h.set_rank_token(zero.rank_token());
         h.set_size_bytes(int64_t{1} << 30);
         return WriteCheckpointCall(*workers_, token, h, "");
       }(),
       grpc::StatusCode::RESOURCE_EXHAUSTED, "bytes"},
      {"not a checkpoint", write(v1::CHECKPOINT_KIND_FINAL, 1, 8, std::string(100'000, 'x')),
       grpc::StatusCode::INVALID_ARGUMENT, "not a checkpoint of job"},
      {"truncated", write(v1::CHECKPOINT_KIND_FINAL, 1, 8, truncated),
       grpc::StatusCode::INVALID_ARGUMENT, "not a checkpoint of job"},
      {"another model's", write(v1::CHECKPOINT_KIND_FINAL, 1, 8, CheckpointFile(dir, other, 1, 8)),
       grpc::StatusCode::INVALID_ARGUMENT, "not a checkpoint of job"},
      {"NaN seconds to write",
       [&] {
         v1::WriteCheckpointHeader h = Header(job, v1::CHECKPOINT_KIND_FINAL, 1, 8, final_file);
         h.set_rank_token(zero.rank_token());
         h.set_write_seconds(std::nan(""));
         return WriteCheckpointCall(*workers_, token, h, final_file);
       }(),
       grpc::StatusCode::INVALID_ARGUMENT, "write_seconds"},
      {"a position other than its header's",
       write(v1::CHECKPOINT_KIND_FINAL, 1, 8, CheckpointFile(dir, spec, 1, 7)),
       grpc::StatusCode::INVALID_ARGUMENT, "step 7"},
  };
  for (const Refused& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(c.status.error_code(), c.code) << c.status.error_message();
    EXPECT_THAT(c.status.error_message(), HasSubstr(c.says));
  }
  EXPECT_TRUE(testing::ListCheckpoints(*training_, job).empty());
  EXPECT_EQ(FilesOf(root_ + "/state/checkpoints/" + job), 0) << "nothing refused is kept";

  // One hand-over at a time: a second while the first is open is refused.
  {
    grpc::ClientContext context;
    context.AddMetadata(kTokenHeader, token);
    v1::Checkpoint ignored;
    auto stalled = workers_->WriteCheckpoint(&context, &ignored);
    v1::WriteCheckpointRequest first;
    *first.mutable_header() = Header(job, v1::CHECKPOINT_KIND_FINAL, 1, 8, final_file);
    first.mutable_header()->set_rank_token(zero.rank_token());
    first.set_data(final_file.substr(0, 1000));
    ASSERT_TRUE(stalled->Write(first));
    absl::SleepFor(absl::Milliseconds(300));
    grpc::Status second = write(v1::CHECKPOINT_KIND_FINAL, 1, 8, final_file);
    EXPECT_EQ(second.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << second.error_message();
    EXPECT_THAT(second.error_message(), HasSubstr("already"));
    context.TryCancel();
    stalled->Finish().IgnoreError();
  }
  // A checkpoint of the job's model where the run would write it is recorded, once.
  v1::Checkpoint record;
  ASSERT_TRUE(testing::WaitFor(
      [&] { return write(v1::CHECKPOINT_KIND_FINAL, 1, 8, final_file, &record).ok(); },
      absl::Seconds(10)));
  EXPECT_EQ(record.global_step(), 8);
  grpc::Status again = write(v1::CHECKPOINT_KIND_FINAL, 1, 8, final_file);
  EXPECT_EQ(again.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << again.error_message();
  EXPECT_EQ(testing::ListCheckpoints(*training_, job).size(), 1u);
  EXPECT_EQ(FilesOf(root_ + "/state/checkpoints/" + job), 1);
}

// Cancel and on-demand: the kinds a run writes when asked, one for each time it is asked.
TEST_F(HostileWorkerTest, AskedForCheckpointsAreTakenOncePerAsking) {
  ASSERT_NO_FATAL_FAILURE(StartKilnd());
  std::string token;
  const std::string job = SubmitExternal(1, &token);
  const v1::JoinJobResponse zero = Join(job, token, 0);
  const v1::JoinJobResponse one = Join(job, token, 1);
  ReportCall calls[2] = {OpenReport(job, token, 0, zero), OpenReport(job, token, 1, one)};
  const std::string dir = root_ + "/made";
  fs::create_directories(dir);
  const std::string bytes = CheckpointFile(dir, testing::SmallSpec("toy", 1), 0, 3);
  auto write = [&](v1::CheckpointKind kind) {
    v1::WriteCheckpointHeader header = Header(job, kind, 0, 3, bytes);
    header.set_rank_token(zero.rank_token());
    return WriteCheckpointCall(*workers_, token, header, bytes);
  };
  EXPECT_EQ(write(v1::CHECKPOINT_KIND_ON_DEMAND).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  // kiln checkpoint JOB: the command reaches rank 0, which writes one.
  std::thread asker([&] {
    grpc::ClientContext context;
    v1::CreateCheckpointRequest request;
    request.set_job_id(job);
    v1::Checkpoint made;
    EXPECT_OK(training_->CreateCheckpoint(&context, request, &made));
  });
  v1::WorkerCommand command;
  ASSERT_TRUE(calls[0].stream->Read(&command));
  EXPECT_EQ(command.action(), v1::WorkerCommand::ACTION_CHECKPOINT);
  EXPECT_OK(write(v1::CHECKPOINT_KIND_ON_DEMAND));
  asker.join();
  EXPECT_EQ(write(v1::CHECKPOINT_KIND_ON_DEMAND).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION)
      << "one a time it is asked";
  EXPECT_EQ(write(v1::CHECKPOINT_KIND_CANCEL).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  grpc::ClientContext cancel_context;
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job);
  v1::Job ignored;
  ASSERT_OK(training_->CancelJob(&cancel_context, cancel, &ignored));
  ASSERT_TRUE(calls[0].stream->Read(&command));
  EXPECT_EQ(command.action(), v1::WorkerCommand::ACTION_CANCEL);
  EXPECT_OK(write(v1::CHECKPOINT_KIND_CANCEL));
  EXPECT_EQ(write(v1::CHECKPOINT_KIND_CANCEL).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(testing::ListCheckpoints(*training_, job).size(), 2u);
  for (ReportCall& call : calls) call.context->TryCancel();
}

// What the checks above refuse must not refuse an honest run's checkpoints: a model with
// buffers (batch norm), dropout streams and Adam's state, with every kind the policy writes, and
// its pruning as for a job in kilnd's process.
TEST_F(HostileWorkerTest, AnHonestRunsCheckpointsAreTakenAndPrunedByThePolicy) {
  ASSERT_NO_FATAL_FAILURE(StartKilnd());
  v1::JobSpec spec = testing::SmallSpec("toy", 3);
  spec.set_workers(2);
  // linear 784-32, batchnorm, relu, dropout, linear 32-10.
  v1::ModelSpec* model = spec.mutable_model();
  const v1::Layer first = model->layers(0), last = model->layers(2);
  model->clear_layers();
  *model->add_layers() = first;
  model->add_layers()->mutable_batchnorm1d()->set_num_features(32);
  model->add_layers()->mutable_relu();
  model->add_layers()->mutable_dropout()->set_p(0.1f);
  *model->add_layers() = last;
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::KIND_ADAM);
  spec.mutable_optimizer()->set_lr(0.001f);
  v1::CheckpointPolicy* policy = spec.mutable_checkpoint_policy();
  policy->set_every_n_epochs(1);
  policy->set_keep_last(1);
  policy->set_keep_best(true);
  const std::string id = testing::SubmitJob(*training_, spec);
  ASSERT_FALSE(id.empty());
  const v1::Job job = WaitForEnd(id, absl::Seconds(120));
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  int periodic = 0, best = 0;
  for (const v1::Checkpoint& c : testing::ListCheckpoints(*training_, id)) {
    periodic += c.kind() == v1::CHECKPOINT_KIND_PERIODIC;
    best += c.kind() == v1::CHECKPOINT_KIND_BEST;
  }
  EXPECT_EQ(periodic, 1) << "keep_last 1";
  EXPECT_EQ(best, 1);
  EXPECT_EQ(FilesOf(root_ + "/state/checkpoints/" + id), periodic + best);
}

}  // namespace
}  // namespace kiln::server
