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
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kiln/v1/worker.grpc.pb.h"
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
    (void)joined;
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

}  // namespace
}  // namespace kiln::server
