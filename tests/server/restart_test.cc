// kilnd as a subprocess: stopped gracefully (SIGTERM) or killed (SIGKILL) mid-training and
// started again on the same state dir, its running job resumes from a checkpoint.
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "inference/grpc_service.grpc.pb.h"
#include "server/jobs/job_store.h"
#include "server/serving/inference_service.h"
#include "server_test_support.h"
#include "tests/support/connected_channel.h"
#include "tests/support/status_matchers.h"
#include "tests/support/uint8_infer_request.h"

namespace kiln::server {
namespace {
namespace fs = std::filesystem;
using testing::GetJob;
using testing::SmallSpec;
using testing::WaitFor;
using testing::WaitForState;

class RestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::MakeTempDir("kilnd-restart");
    state_dir_ = root_ + "/state";
    data_dir_ = root_ + "/data";
    testing::WriteToyDataset(data_dir_ + "/toy", 256, 64);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  std::unique_ptr<testing::KilndProcess> StartKilnd(std::vector<std::string> flags = {}) {
    flags.push_back("--step_delay=15ms");
    auto kilnd = std::make_unique<testing::KilndProcess>(state_dir_, data_dir_, flags);
    EXPECT_TRUE(kilnd->Start()) << "kilnd did not start";
    return kilnd;
  }

  std::string Submit(v1::Training::Stub& stub, const v1::JobSpec& spec) {
    grpc::ClientContext context;
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    v1::Job job;
    grpc::Status status = stub.SubmitJob(&context, request, &job);
    EXPECT_OK(status) << status.error_message();
    return job.id();
  }

  std::vector<v1::Checkpoint> Checkpoints(v1::Training::Stub& stub, const std::string& id) {
    grpc::ClientContext context;
    v1::ListCheckpointsRequest request;
    request.set_job_id(id);
    v1::ListCheckpointsResponse response;
    EXPECT_OK(stub.ListCheckpoints(&context, request, &response));
    return {response.checkpoints().begin(), response.checkpoints().end()};
  }

  std::string root_, state_dir_, data_dir_;
};

TEST_F(RestartTest, GracefulStopCheckpointsTheRunningJobAndRestartResumesIt) {
  auto kilnd = StartKilnd();
  auto stub = kilnd->NewStub();
  const std::string id = Submit(*stub, SmallSpec("toy", 5));
  ASSERT_TRUE(WaitFor([&] { return GetJob(*stub, id).global_step() >= 12; }, absl::Seconds(60)));

  ASSERT_EQ(kilnd->Stop(SIGTERM, absl::Seconds(20)), 0) << "kilnd's exit code after SIGTERM";

  kilnd = StartKilnd();
  stub = kilnd->NewStub();
  ASSERT_TRUE(WaitForState(*stub, id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(90)));
  v1::Job job = GetJob(*stub, id);
  EXPECT_EQ(job.attempts(), 2);
  EXPECT_GE(job.resumed_from_step(), 12);
  EXPECT_EQ(job.global_step(), 5 * 8);
  bool shutdown_checkpoint = false;
  for (const v1::Checkpoint& c : Checkpoints(*stub, id)) {
    shutdown_checkpoint |= c.kind() == v1::CHECKPOINT_KIND_SHUTDOWN;
  }
  EXPECT_TRUE(shutdown_checkpoint);

  // The resumed run continued exactly where it stopped: every epoch once, in order.
  testing::WatchResult w = testing::WatchToEnd(*stub, id);
  ASSERT_OK(w.status);
  std::vector<int> epochs;
  for (const auto& e : w.events) {
    if (e.has_epoch()) epochs.push_back(e.epoch().epoch());
  }
  EXPECT_EQ(epochs, (std::vector<int>{1, 2, 3, 4, 5}));
  EXPECT_EQ(w.events.back().state().state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(RestartTest, KilledDaemonResumesTheJobFromItsLastCheckpoint) {
  auto kilnd = StartKilnd();
  auto stub = kilnd->NewStub();
  v1::JobSpec spec = SmallSpec("toy", 6);
  spec.mutable_checkpoint_policy()->set_every_n_epochs(1);
  const std::string id = Submit(*stub, spec);
  // A queued job must stay queued across the crash too.
  const std::string queued = Submit(*stub, SmallSpec("toy", 1));
  ASSERT_TRUE(WaitFor([&] { return Checkpoints(*stub, id).size() >= 2; }, absl::Seconds(60)));
  kilnd->Stop(SIGKILL, absl::Seconds(10));
  stub.reset();

  kilnd = StartKilnd();
  stub = kilnd->NewStub();
  ASSERT_TRUE(WaitForState(*stub, id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(90)));
  v1::Job job = GetJob(*stub, id);
  EXPECT_EQ(job.attempts(), 2);
  EXPECT_GE(job.resumed_from_step(), 16) << "resumed from the epoch-2 checkpoint or later";
  EXPECT_EQ(job.resumed_from_step() % 8, 0) << "periodic checkpoints sit at epoch ends";
  EXPECT_EQ(job.global_step(), 6 * 8);
  EXPECT_TRUE(WaitForState(*stub, queued, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60)));

  testing::WatchResult w = testing::WatchToEnd(*stub, id);
  ASSERT_OK(w.status);
  std::set<int> epochs;
  std::vector<v1::JobState> states;
  for (const auto& e : w.events) {
    if (e.has_epoch()) epochs.insert(e.epoch().epoch());
    if (e.has_state()) states.push_back(e.state().state());
  }
  EXPECT_EQ(epochs, (std::set<int>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(states, (std::vector<v1::JobState>{v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING,
                                               v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING,
                                               v1::JOB_STATE_SUCCEEDED}));
}

// A job running whenever kilnd dies may be what kills it: it is resumed at most
// --max_crash_resumes times, then fails with the reason instead of taking kilnd down again.
TEST_F(RestartTest, AJobRunningThroughTooManyCrashesFailsInsteadOfResumingAgain) {
  const std::vector<std::string> flags = {"--max_crash_resumes=1"};
  auto kilnd = StartKilnd(flags);
  auto stub = kilnd->NewStub();
  v1::JobSpec spec = SmallSpec("toy", 50);
  spec.mutable_checkpoint_policy()->set_every_n_epochs(1);
  const std::string id = Submit(*stub, spec);
  ASSERT_TRUE(WaitFor([&] { return !Checkpoints(*stub, id).empty(); }, absl::Seconds(60)));
  kilnd->Stop(SIGKILL, absl::Seconds(10));
  stub.reset();

  // The first crash: resumed, and counted.
  kilnd = StartKilnd(flags);
  stub = kilnd->NewStub();
  ASSERT_TRUE(WaitForState(*stub, id, v1::JOB_STATE_RUNNING, absl::Seconds(60)));
  v1::Job job = GetJob(*stub, id);
  EXPECT_EQ(job.crash_resumes(), 1);
  kilnd->Stop(SIGKILL, absl::Seconds(10));
  stub.reset();

  // The second: over the limit, the job fails and kilnd stays up.
  kilnd = StartKilnd(flags);
  stub = kilnd->NewStub();
  ASSERT_TRUE(WaitForState(*stub, id, v1::JOB_STATE_FAILED, absl::Seconds(60)));
  job = GetJob(*stub, id);
  EXPECT_EQ(job.crash_resumes(), 2);
  EXPECT_THAT(job.reason(), ::testing::HasSubstr("stopped without a clean shutdown 2 times"));
  EXPECT_THAT(job.reason(), ::testing::HasSubstr("--max_crash_resumes=1"));
}

// A clean shutdown is not a crash: it does not count against --max_crash_resumes.
TEST_F(RestartTest, CleanShutdownsDoNotCountAsCrashes) {
  const std::vector<std::string> flags = {"--max_crash_resumes=0"};
  auto kilnd = StartKilnd(flags);
  auto stub = kilnd->NewStub();
  const std::string id = Submit(*stub, SmallSpec("toy", 50));
  ASSERT_TRUE(WaitForState(*stub, id, v1::JOB_STATE_RUNNING, absl::Seconds(60)));
  for (int restart = 0; restart < 2; ++restart) {
    kilnd->Stop(SIGTERM, absl::Seconds(30));
    stub.reset();
    kilnd = StartKilnd(flags);
    stub = kilnd->NewStub();
    ASSERT_TRUE(WaitForState(*stub, id, v1::JOB_STATE_RUNNING, absl::Seconds(60)));
    EXPECT_EQ(GetJob(*stub, id).crash_resumes(), 0);
  }
}

// Deployments through the KServe repository extension, as `kiln deploy` makes them.
class DeploymentRestartTest : public RestartTest {
 protected:
  static std::unique_ptr<inference::GRPCInferenceService::Stub> Inference(
      const testing::KilndProcess& kilnd) {
    return inference::GRPCInferenceService::NewStub(
        kiln::testing::ConnectedChannel(kilnd.address()));
  }
  static grpc::Status Load(inference::GRPCInferenceService::Stub& stub, const std::string& model,
                           const std::string& checkpoint, int64_t max_batch_size = 0) {
    grpc::ClientContext context;
    inference::RepositoryModelLoadRequest request;
    request.set_model_name(model);
    (*request.mutable_parameters())["checkpoint"].set_string_param(checkpoint);
    if (max_batch_size > 0) {
      (*request.mutable_parameters())["max_batch_size"].set_int64_param(max_batch_size);
    }
    inference::RepositoryModelLoadResponse response;
    return stub.RepositoryModelLoad(&context, request, &response);
  }
  // "model:version:state:reason", sorted by model.
  static std::vector<std::string> Index(inference::GRPCInferenceService::Stub& stub) {
    grpc::ClientContext context;
    inference::RepositoryIndexResponse response;
    EXPECT_OK(stub.RepositoryIndex(&context, {}, &response));
    std::vector<std::string> out;
    for (const auto& m : response.models()) {
      out.push_back(m.name() + ":" + m.version() + ":" + m.state() + ":" + m.reason());
    }
    return out;
  }
  // Waits until serving's health is SERVING (every recorded model loaded or failed).
  static bool WaitUntilServing(const testing::KilndProcess& kilnd) {
    auto health =
        grpc::health::v1::Health::NewStub(kiln::testing::ConnectedChannel(kilnd.address()));
    return WaitFor(
        [&] {
          grpc::ClientContext context;
          grpc::health::v1::HealthCheckRequest request;
          request.set_service("inference.GRPCInferenceService");
          grpc::health::v1::HealthCheckResponse response;
          return health->Check(&context, request, &response).ok() &&
                 response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
        },
        absl::Seconds(60));
  }
  static std::string ServedVersion(inference::GRPCInferenceService::Stub& stub,
                                   const std::string& model, std::string* probabilities = nullptr) {
    grpc::ClientContext context;
    const inference::ModelInferRequest request =
        kiln::testing::Uint8InferRequest(model, 1, std::string(784, '\x40'));
    inference::ModelInferResponse response;
    grpc::Status status = stub.ModelInfer(&context, request, &response);
    if (probabilities != nullptr && status.ok() && response.raw_output_contents_size() > 0) {
      *probabilities = response.raw_output_contents(0);
    }
    return status.ok() ? response.model_version() : "error: " + status.error_message();
  }
};

TEST_F(DeploymentRestartTest, DeployedModelsAndVersionsComeBackAfterARestart) {
  auto kilnd = StartKilnd();
  auto stub = kilnd->NewStub();
  v1::JobSpec spec = SmallSpec("toy", 2);
  spec.mutable_checkpoint_policy()->set_every_n_epochs(1);
  spec.mutable_checkpoint_policy()->set_keep_last(5);
  const std::string id = Submit(*stub, spec);
  ASSERT_TRUE(WaitForState(*stub, id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(90)));
  const std::vector<v1::Checkpoint> checkpoints = Checkpoints(*stub, id);
  ASSERT_GE(checkpoints.size(), 2u);
  // Versions are numbered per model: the first checkpoint is digits' version 1, the last its 2.
  const std::string first = "1", last = "2";

  auto inference = Inference(*kilnd);
  ASSERT_OK(Load(*inference, "digits", id + "@" + std::to_string(checkpoints.front().id()), 8));
  ASSERT_OK(Load(*inference, "digits", id + "@latest"));
  ASSERT_OK(Load(*inference, "best", id + "@best"));
  ASSERT_OK(Load(*inference, "dropped", id + "@latest"));
  {
    grpc::ClientContext context;
    inference::RepositoryModelUnloadRequest request;
    request.set_model_name("dropped");
    inference::RepositoryModelUnloadResponse response;
    ASSERT_OK(inference->RepositoryModelUnload(&context, request, &response));
  }
  EXPECT_EQ(ServedVersion(*inference, "digits"), last);
  const std::vector<std::string> before = Index(*inference);

  ASSERT_EQ(kilnd->Stop(SIGTERM, absl::Seconds(20)), 0);
  kilnd = StartKilnd();
  ASSERT_TRUE(WaitUntilServing(*kilnd));
  inference = Inference(*kilnd);
  std::vector<std::string> ready;
  for (const std::string& e : before) {
    if (e.find(":READY:") != std::string::npos) ready.push_back(e);
  }
  EXPECT_EQ(Index(*inference), ready);
  EXPECT_THAT(ready,
              ::testing::ElementsAre(::testing::StartsWith("best:"),
                                     "digits:" + first + ":READY:", "digits:" + last + ":READY:"));
  // The newest version still answers by default, and the older one by name.
  EXPECT_EQ(ServedVersion(*inference, "digits"), last);

  // A checkpoint damaged while kilnd was down: its version is UNAVAILABLE with the reason, and
  // the others still load.
  ASSERT_EQ(kilnd->Stop(SIGTERM, absl::Seconds(20)), 0);
  {
    std::fstream f(checkpoints.front().path(), std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << checkpoints.front().path();
    f.seekp(-8, std::ios::end);
    f.write("DAMAGED!", 8);
  }
  kilnd = StartKilnd();
  ASSERT_TRUE(WaitUntilServing(*kilnd));
  inference = Inference(*kilnd);
  const std::vector<std::string> after = Index(*inference);
  ASSERT_EQ(after.size(), 3u) << ::testing::PrintToString(after);
  EXPECT_THAT(after[0], ::testing::StartsWith("best:"));
  EXPECT_THAT(after, ::testing::Contains(::testing::AllOf(
                         ::testing::StartsWith("digits:" + first + ":UNAVAILABLE:DATA_LOSS: "),
                         ::testing::HasSubstr("damaged on disk"))));
  EXPECT_THAT(after, ::testing::Contains("digits:" + last + ":READY:"));
  EXPECT_EQ(ServedVersion(*inference, "digits"), last);
}

// A start that dies while restoring a deployment (killed for memory) leaves its mark in the store,
// made here by hand: the next starts do not load that deployment again (it is UNAVAILABLE with
// the reason, its record kept) and restore the others, until it is loaded again by hand. A
// deployment over the serving memory budget is refused at restore alone, and tried again at the
// next start.
TEST_F(DeploymentRestartTest, ADeploymentAStartDiedRestoringIsHeldBackUntilLoadedByHand) {
  auto kilnd = StartKilnd();
  auto stub = kilnd->NewStub();
  v1::JobSpec spec = SmallSpec("toy", 1);
  spec.mutable_checkpoint_policy()->set_every_n_epochs(1);
  const std::string id = Submit(*stub, spec);
  ASSERT_TRUE(WaitForState(*stub, id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(90)));
  auto inference = Inference(*kilnd);
  ASSERT_OK(Load(*inference, "a", id + "@latest"));
  ASSERT_OK(Load(*inference, "b", id + "@latest"));
  ASSERT_EQ(kilnd->Stop(SIGTERM, absl::Seconds(20)), 0);
  {
    auto store = JobStore::Open(state_dir_ + "/kiln.db");
    ASSERT_OK(store);
    ASSERT_OK((*store)->MarkDeploymentRestoring("b", "1"));
  }
  const std::string held = std::string("b:1:UNAVAILABLE:") + serving::kInterruptedRestoreReason;
  for (int start = 0; start < 2; ++start) {  // held back at every start, not every other one
    kilnd = StartKilnd();
    ASSERT_TRUE(WaitUntilServing(*kilnd));
    inference = Inference(*kilnd);
    EXPECT_THAT(Index(*inference), ::testing::ElementsAre("a:1:READY:", held)) << start;
    ASSERT_EQ(kilnd->Stop(SIGTERM, absl::Seconds(20)), 0);
  }

  kilnd = StartKilnd();
  ASSERT_TRUE(WaitUntilServing(*kilnd));
  inference = Inference(*kilnd);
  {
    grpc::ClientContext context;
    inference::RepositoryModelLoadRequest request;
    request.set_model_name("b");
    (*request.mutable_parameters())["checkpoint"].set_string_param(id + "@latest");
    (*request.mutable_parameters())["version"].set_string_param("1");
    inference::RepositoryModelLoadResponse response;
    ASSERT_OK(inference->RepositoryModelLoad(&context, request, &response));
  }
  EXPECT_THAT(Index(*inference), ::testing::ElementsAre("a:1:READY:", "b:1:READY:"));
  ASSERT_EQ(kilnd->Stop(SIGTERM, absl::Seconds(20)), 0);

  kilnd = StartKilnd({"--max_serving_memory_bytes=1"});
  ASSERT_TRUE(WaitUntilServing(*kilnd));
  inference = Inference(*kilnd);
  const auto refused = ::testing::AllOf(
      ::testing::HasSubstr(":1:UNAVAILABLE:RESOURCE_EXHAUSTED: "),
      ::testing::HasSubstr("more than the 1 B all served versions may use (1 bytes, "
                           "--max_serving_memory_bytes)"));
  EXPECT_THAT(Index(*inference), ::testing::ElementsAre(refused, refused));
  ASSERT_EQ(kilnd->Stop(SIGTERM, absl::Seconds(20)), 0);

  kilnd = StartKilnd();
  ASSERT_TRUE(WaitUntilServing(*kilnd));
  inference = Inference(*kilnd);
  EXPECT_THAT(Index(*inference), ::testing::ElementsAre("a:1:READY:", "b:1:READY:"));
}

// A model deployed with follow from a job still training gets a version for each new checkpoint
// of its source, and ends on the job's last one.
TEST_F(DeploymentRestartTest, AModelFollowingARunningJobServesItsLatestCheckpoint) {
  auto kilnd = StartKilnd();
  auto stub = kilnd->NewStub();
  v1::JobSpec spec = SmallSpec("toy", 12);
  spec.mutable_checkpoint_policy()->set_every_n_epochs(1);
  const std::string id = Submit(*stub, spec);
  ASSERT_TRUE(WaitFor([&] { return !Checkpoints(*stub, id).empty(); }, absl::Seconds(60)));
  auto inference = Inference(*kilnd);
  {
    grpc::ClientContext context;
    inference::RepositoryModelLoadRequest request;
    request.set_model_name("live");
    (*request.mutable_parameters())["checkpoint"].set_string_param(id + "@latest");
    (*request.mutable_parameters())["follow"].set_string_param("true");
    inference::RepositoryModelLoadResponse response;
    ASSERT_OK(inference->RepositoryModelLoad(&context, request, &response));
  }
  ASSERT_TRUE(WaitForState(*stub, id, v1::JOB_STATE_SUCCEEDED, absl::Seconds(90)));
  // The job's final checkpoint, deployed on its own, is what "live" must end up answering with.
  ASSERT_OK(Load(*inference, "final", id + "@latest"));
  std::string expected;
  ASSERT_EQ(ServedVersion(*inference, "final", &expected), "1");
  std::string answer, version;
  EXPECT_TRUE(WaitFor(
      [&] {
        version = ServedVersion(*inference, "live", &answer);
        return !answer.empty() && answer == expected;
      },
      absl::Seconds(30)))
      << "live still answers with version " << version;
  EXPECT_GT(std::stoi(version), 1) << "no version was added while the job trained";
  // The default version policy keeps the three highest.
  std::vector<std::string> live;
  for (const std::string& e : Index(*inference)) {
    if (e.rfind("live:", 0) == 0) live.push_back(e);
  }
  EXPECT_LE(live.size(), 3u) << ::testing::PrintToString(live);
  EXPECT_EQ(live.back(), "live:" + version + ":READY:");
}

}  // namespace
}  // namespace kiln::server
