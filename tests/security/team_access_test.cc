// Who may do what, through kilnd as a subprocess with a token file of identities: a viewer reads
// but changes nothing, a member changes its own team's jobs and datasets and finds another
// team's not there (NOT_FOUND, as for one that does not exist), an admin does everything, a
// dataset placed by hand is every team's to read, every change is audited, and the CLI, the web
// page's API and WhoAmI say who the caller is and who owns what.
#include <httplib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli_test_support.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inference/grpc_service.grpc.pb.h"
#include "kiln/v1/training.grpc.pb.h"
#include "security_test_support.h"
#include "tests/support/connected_channel.h"
#include "tests/support/status_matchers.h"
#include "tests/support/uint8_infer_request.h"

namespace kiln::security::testing {
namespace {

using client::testing::MakeTempDir;
using client::testing::RunCommand;
using client::testing::RunResult;
using client::testing::WriteFile;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kAlice[] = "tok-alice-4c1d";  // member of vision
constexpr char kBob[] = "tok-bob-77e0";      // viewer of vision
constexpr char kCarol[] = "tok-carol-09aa";  // member of speech
constexpr char kRoot[] = "tok-root-e5b2";    // admin

class TeamAccessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = MakeTempDir("kiln-teams");
    std::filesystem::create_directories(root_ + "/data");
    WriteFile(root_ + "/tokens", absl::StrCat("# kilnd's people\n",                             //
                                              kAlice, " user=alice team=vision role=member\n",  //
                                              kBob, " user=bob team=vision role=viewer\n",      //
                                              kCarol, " user=carol team=speech role=member\n",  //
                                              kRoot, " user=root role=admin\n"));
    // Placed by hand, as an operator shares MNIST: no owner, every team reads it.
    client::testing::WriteToyDataset(root_ + "/data/toy", 64, 16);
    kilnd_ = std::make_unique<KilndUnderTest>(root_);
    // Slow steps keep a job running while the test looks at it.
    ASSERT_TRUE(kilnd_->Start({"--auth_tokens_file=" + root_ + "/tokens", "--step_delay=50ms"}))
        << kilnd_->Stderr();
    stub_ = v1::Training::NewStub(kiln::testing::ConnectedChannel(kilnd_->address()));
  }
  void TearDown() override {
    kilnd_.reset();
    std::filesystem::remove_all(root_);
  }

  grpc::Status Submit(const std::string& token, v1::Job* job, const std::string& dataset = "toy") {
    v1::SubmitJobRequest request;
    request.mutable_spec()->set_preset("mnist-mlp");
    request.mutable_spec()->set_dataset(dataset);
    request.mutable_spec()->set_epochs(50);
    return stub_->SubmitJob(ContextWithToken(token).get(), request, job);
  }
  grpc::Status Get(const std::string& token, const std::string& job_id, v1::Job* job) {
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    return stub_->GetJob(ContextWithToken(token).get(), request, job);
  }
  grpc::Status Cancel(const std::string& token, const std::string& job_id) {
    v1::CancelJobRequest request;
    request.set_job_id(job_id);
    v1::Job job;
    return stub_->CancelJob(ContextWithToken(token).get(), request, &job);
  }
  std::vector<std::string> ListedJobs(const std::string& token) {
    v1::ListJobsResponse response;
    EXPECT_OK(stub_->ListJobs(ContextWithToken(token).get(), v1::ListJobsRequest(), &response));
    std::vector<std::string> ids;
    for (const v1::Job& j : response.jobs()) ids.push_back(j.id());
    return ids;
  }
  std::vector<std::string> ListedDatasets(const std::string& token) {
    v1::ListDatasetsResponse response;
    EXPECT_OK(
        stub_->ListDatasets(ContextWithToken(token).get(), v1::ListDatasetsRequest(), &response));
    std::vector<std::string> names;
    for (const v1::Dataset& d : response.datasets()) names.push_back(d.name());
    return names;
  }
  RunResult Kiln(const std::string& token, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {KILN_PATH, "--server", kilnd_->address()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, {"KILN_TOKEN=" + token}, absl::Seconds(60));
  }

  std::string root_;
  std::unique_ptr<KilndUnderTest> kilnd_;
  std::unique_ptr<v1::Training::Stub> stub_;
};

TEST_F(TeamAccessTest, AViewerReadsItsTeamsJobsButChangesNothing) {
  v1::Job job;
  grpc::Status refused = Submit(kBob, &job);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(refused.error_message(), HasSubstr("user \"bob\" (role viewer) may not submit_job"));

  ASSERT_OK(Submit(kAlice, &job));
  EXPECT_EQ(job.owner().user(), "alice");
  EXPECT_EQ(job.owner().team(), "vision");
  v1::Job seen;
  ASSERT_OK(Get(kBob, job.id(), &seen));
  EXPECT_EQ(seen.owner().user(), "alice");
  EXPECT_THAT(ListedJobs(kBob), ::testing::Contains(job.id()));
  EXPECT_EQ(Cancel(kBob, job.id()).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_OK(Get(kAlice, job.id(), &seen));
  EXPECT_NE(seen.state(), v1::JOB_STATE_CANCELLED);
  ASSERT_OK(Cancel(kAlice, job.id()));
}

TEST_F(TeamAccessTest, OnlyAnAdminSubmitsAJobNoOneMayPreempt) {
  v1::SubmitJobRequest request;
  request.mutable_spec()->set_preset("mnist-mlp");
  request.mutable_spec()->set_dataset("toy");
  request.mutable_spec()->set_epochs(1);
  request.mutable_spec()->set_non_preemptible(true);
  v1::Job job;
  grpc::Status refused = stub_->SubmitJob(ContextWithToken(kAlice).get(), request, &job);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(refused.error_message(), HasSubstr("spec.non_preemptible: only an admin"));
  ASSERT_OK(stub_->SubmitJob(ContextWithToken(kRoot).get(), request, &job));
  EXPECT_TRUE(job.spec().non_preemptible());
}

TEST_F(TeamAccessTest, AnotherTeamsJobIsNotFoundAndAnAdminSeesAndChangesIt) {
  v1::Job job;
  ASSERT_OK(Submit(kAlice, &job));
  v1::Job seen;
  grpc::Status hidden = Get(kCarol, job.id(), &seen);
  grpc::Status missing = Get(kCarol, "job-000000000000", &seen);
  EXPECT_EQ(hidden.error_code(), grpc::StatusCode::NOT_FOUND);
  // Word for word what a job that does not exist answers, but for its id: no hint.
  EXPECT_EQ(hidden.error_message(), absl::StrCat("job ", job.id(), " not found"));
  EXPECT_EQ(missing.error_message(), "job job-000000000000 not found");
  EXPECT_EQ(Cancel(kCarol, job.id()).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(ListedJobs(kCarol), Not(::testing::Contains(job.id())));
  v1::WatchJobRequest watch;
  watch.set_job_id(job.id());
  auto context = ContextWithToken(kCarol);
  auto reader = stub_->WatchJob(context.get(), watch);
  v1::JobEvent event;
  EXPECT_FALSE(reader->Read(&event));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);

  // Carol's own job is hers; the admin sees both and may cancel Alice's.
  v1::Job carols;
  ASSERT_OK(Submit(kCarol, &carols));
  EXPECT_THAT(ListedJobs(kAlice), Not(::testing::Contains(carols.id())));
  EXPECT_THAT(ListedJobs(kRoot), ::testing::IsSupersetOf({job.id(), carols.id()}));
  ASSERT_OK(Cancel(kRoot, job.id()));
  ASSERT_OK(Cancel(kCarol, carols.id()));

  // Every change and refusal is in the audit log, with who, what, which and how it went.
  ASSERT_TRUE(kilnd_->WaitForStderr("action=cancel_job", 3, absl::Seconds(10))) << kilnd_->Stderr();
  const std::string log = kilnd_->Stderr();
  EXPECT_THAT(log, HasSubstr(absl::StrCat("user=carol team=speech role=member action=cancel_job "
                                          "object=",
                                          job.id(), " outcome=NOT_FOUND")));
  EXPECT_THAT(log, HasSubstr(absl::StrCat(
                       "user=root team=\"\" role=admin action=cancel_job object=", job.id(),
                       " outcome=ok")));
  EXPECT_THAT(log, HasSubstr(absl::StrCat("user=alice team=vision role=member action=submit_job "
                                          "object=",
                                          job.id(), " outcome=ok")));
  for (const char* token : {kAlice, kBob, kCarol, kRoot}) EXPECT_THAT(log, Not(HasSubstr(token)));
}

TEST_F(TeamAccessTest, DatasetsAreTheUploadersTeamsAndOnesPlacedByHandEveryonesToRead) {
  const std::string dir = root_ + "/upload";
  client::testing::WriteToyDataset(dir, 32, 8, /*seed=*/5);
  RunResult upload = Kiln(
      kAlice, {"upload", "vis-data", "--train-images", dir + "/train-images-idx3-ubyte",
               "--train-labels", dir + "/train-labels-idx1-ubyte", "--test-images",
               dir + "/t10k-images-idx3-ubyte", "--test-labels", dir + "/t10k-labels-idx1-ubyte"});
  ASSERT_EQ(upload.exit_code, 0) << upload.out << upload.err;
  EXPECT_THAT(ListedDatasets(kBob), ::testing::UnorderedElementsAre("toy", "vis-data"));
  EXPECT_THAT(ListedDatasets(kCarol), ::testing::UnorderedElementsAre("toy"));

  // Carol neither trains on it nor deletes it: it is not there for her.
  v1::Job job;
  grpc::Status submit = Submit(kCarol, &job, "vis-data");
  EXPECT_EQ(submit.error_code(), grpc::StatusCode::NOT_FOUND) << submit.error_message();
  EXPECT_THAT(submit.error_message(), HasSubstr("dataset \"vis-data\" not found"));
  v1::DeleteDatasetRequest del;
  del.set_name("vis-data");
  v1::DeleteDatasetResponse deleted;
  EXPECT_EQ(stub_->DeleteDataset(ContextWithToken(kCarol).get(), del, &deleted).error_code(),
            grpc::StatusCode::NOT_FOUND);
  // The shared one is hers to train on, only an admin's to delete.
  ASSERT_OK(Submit(kCarol, &job, "toy"));
  ASSERT_OK(Cancel(kCarol, job.id()));
  del.set_name("toy");
  grpc::Status shared = stub_->DeleteDataset(ContextWithToken(kCarol).get(), del, &deleted);
  EXPECT_EQ(shared.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(shared.error_message(), HasSubstr("belongs to no team"));

  RunResult listed = Kiln(kBob, {"datasets"});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_THAT(listed.out, HasSubstr("OWNER"));
  EXPECT_THAT(listed.out, HasSubstr("alice/vision"));
  del.set_name("vis-data");
  ASSERT_OK(stub_->DeleteDataset(ContextWithToken(kAlice).get(), del, &deleted));
}

TEST_F(TeamAccessTest, WhoAmIAndTheCliSayWhoTheCallerIsAndWhoOwnsWhat) {
  v1::WhoAmIResponse me;
  ASSERT_OK(stub_->WhoAmI(ContextWithToken(kCarol).get(), v1::WhoAmIRequest(), &me));
  EXPECT_EQ(me.user(), "carol");
  EXPECT_EQ(me.team(), "speech");
  EXPECT_EQ(me.role(), "member");
  EXPECT_TRUE(me.auth());

  RunResult whoami = Kiln(kBob, {"whoami"});
  ASSERT_EQ(whoami.exit_code, 0) << whoami.err;
  EXPECT_THAT(whoami.out, HasSubstr("bob"));
  EXPECT_THAT(whoami.out, HasSubstr("viewer"));

  v1::Job job;
  ASSERT_OK(Submit(kAlice, &job));
  RunResult jobs = Kiln(kBob, {"jobs"});
  ASSERT_EQ(jobs.exit_code, 0) << jobs.err;
  EXPECT_THAT(jobs.out, HasSubstr("OWNER"));
  EXPECT_THAT(jobs.out, HasSubstr("alice/vision"));
  RunResult cancel = Kiln(kBob, {"cancel", job.id()});
  EXPECT_EQ(cancel.exit_code, 1);
  EXPECT_THAT(cancel.err, HasSubstr("may not cancel_job"));

  // The web page's API applies the same rules.
  httplib::Client http("127.0.0.1", kilnd_->metrics_port());
  httplib::Result theirs = http.Get(absl::StrCat("/api/jobs/", job.id()).c_str(),
                                    {{"Authorization", absl::StrCat("Bearer ", kCarol)}});
  ASSERT_TRUE(theirs);
  EXPECT_EQ(theirs->status, 404);
  httplib::Result list =
      http.Get("/api/jobs", {{"Authorization", absl::StrCat("Bearer ", kCarol)}});
  ASSERT_TRUE(list);
  EXPECT_THAT(list->body, Not(HasSubstr(job.id())));
  httplib::Result cancel_web =
      http.Post(absl::StrCat("/api/jobs/", job.id(), "/cancel").c_str(),
                {{"Authorization", absl::StrCat("Bearer ", kBob)}}, "", "application/json");
  ASSERT_TRUE(cancel_web);
  EXPECT_EQ(cancel_web->status, 403);
  ASSERT_OK(Cancel(kAlice, job.id()));
}

TEST_F(TeamAccessTest, AModelIsItsJobsTeamsToSeePredictAndDeploy) {
  v1::SubmitJobRequest submit;
  submit.mutable_spec()->set_preset("mnist-mlp");
  submit.mutable_spec()->set_dataset("toy");
  submit.mutable_spec()->set_epochs(1);
  v1::Job job;
  ASSERT_OK(stub_->SubmitJob(ContextWithToken(kAlice).get(), submit, &job));
  v1::GetJobRequest get;
  get.set_job_id(job.id());
  for (int i = 0; i < 600 && job.state() != v1::JOB_STATE_SUCCEEDED; ++i) {
    ASSERT_OK(stub_->GetJob(ContextWithToken(kAlice).get(), get, &job));
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();

  auto serving =
      inference::GRPCInferenceService::NewStub(kiln::testing::ConnectedChannel(kilnd_->address()));
  inference::RepositoryModelLoadRequest load;
  load.set_model_name("vis-model");
  (*load.mutable_parameters())["checkpoint"].set_string_param(job.id());
  inference::RepositoryModelLoadResponse loaded;
  // Carol's team does not see the job: it is not there to deploy from.
  grpc::Status theirs = serving->RepositoryModelLoad(ContextWithToken(kCarol).get(), load, &loaded);
  EXPECT_EQ(theirs.error_code(), grpc::StatusCode::NOT_FOUND) << theirs.error_message();
  EXPECT_EQ(serving->RepositoryModelLoad(ContextWithToken(kBob).get(), load, &loaded).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_OK(serving->RepositoryModelLoad(ContextWithToken(kAlice).get(), load, &loaded));

  const inference::ModelInferRequest request =
      kiln::testing::Uint8InferRequest("vis-model", 1, std::string(784, '\x40'));
  inference::ModelInferResponse response;
  ASSERT_OK(serving->ModelInfer(ContextWithToken(kBob).get(), request, &response));
  grpc::Status hidden = serving->ModelInfer(ContextWithToken(kCarol).get(), request, &response);
  EXPECT_EQ(hidden.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(hidden.error_message(), "unknown model \"vis-model\"");
  inference::ModelMetadataRequest meta;
  meta.set_name("vis-model");
  inference::ModelMetadataResponse metadata;
  EXPECT_EQ(serving->ModelMetadata(ContextWithToken(kCarol).get(), meta, &metadata).error_code(),
            grpc::StatusCode::NOT_FOUND);
  auto indexed = [&](const std::string& token) {
    inference::RepositoryIndexResponse index;
    EXPECT_OK(serving->RepositoryIndex(ContextWithToken(token).get(),
                                       inference::RepositoryIndexRequest(), &index));
    for (const auto& m : index.models()) {
      if (m.name() == "vis-model") return true;
    }
    return false;
  };
  EXPECT_TRUE(indexed(kBob));
  EXPECT_TRUE(indexed(kRoot));
  EXPECT_FALSE(indexed(kCarol));
  // Nor can Carol unload it, or load her own job's weights under its name.
  inference::RepositoryModelUnloadRequest unload;
  unload.set_model_name("vis-model");
  inference::RepositoryModelUnloadResponse unloaded;
  EXPECT_EQ(serving->RepositoryModelUnload(ContextWithToken(kCarol).get(), unload, &unloaded)
                .error_code(),
            grpc::StatusCode::NOT_FOUND);
  ASSERT_OK(serving->ModelInfer(ContextWithToken(kBob).get(), request, &response));
  v1::Job carols;
  ASSERT_OK(stub_->SubmitJob(ContextWithToken(kCarol).get(), submit, &carols));
  get.set_job_id(carols.id());
  for (int i = 0; i < 600 && carols.state() != v1::JOB_STATE_SUCCEEDED; ++i) {
    ASSERT_OK(stub_->GetJob(ContextWithToken(kCarol).get(), get, &carols));
    absl::SleepFor(absl::Milliseconds(100));
  }
  (*load.mutable_parameters())["checkpoint"].set_string_param(carols.id());
  grpc::Status taken = serving->RepositoryModelLoad(ContextWithToken(kCarol).get(), load, &loaded);
  EXPECT_EQ(taken.error_code(), grpc::StatusCode::ALREADY_EXISTS) << taken.error_message();
  // The web page's model list too.
  httplib::Client http("127.0.0.1", kilnd_->metrics_port());
  httplib::Result models =
      http.Get("/api/models", {{"Authorization", absl::StrCat("Bearer ", kCarol)}});
  ASSERT_TRUE(models);
  EXPECT_THAT(models->body, Not(HasSubstr("vis-model")));
  ASSERT_TRUE(kilnd_->WaitForStderr("action=deploy", 3, absl::Seconds(10))) << kilnd_->Stderr();
  EXPECT_THAT(kilnd_->Stderr(),
              HasSubstr("user=alice team=vision role=member action=deploy object=\"model vis-model "
                        "from " +
                        job.id() + "\" outcome=ok"));
}

TEST(TeamStorageQuotaTest, UploadsPastATeamsStorageQuotaAreRefusedNamingIt) {
  const std::string root = MakeTempDir("kiln-quota");
  std::filesystem::create_directories(root + "/data");
  WriteFile(root + "/tokens", absl::StrCat(kAlice, " user=alice team=vision role=member\n", kCarol,
                                           " user=carol team=speech role=member\n"));
  KilndUnderTest kilnd(root);
  // Room for one toy dataset of 32 + 8 images (31 KiB), not two.
  ASSERT_TRUE(
      kilnd.Start({"--auth_tokens_file=" + root + "/tokens", "--team_max_storage_bytes=50000"}))
      << kilnd.Stderr();
  const std::string dir = root + "/upload";
  client::testing::WriteToyDataset(dir, 32, 8, /*seed=*/5);
  auto upload = [&](const char* token, const std::string& name) {
    return RunCommand(
        {KILN_PATH, "--server", kilnd.address(), "upload", name, "--train-images",
         dir + "/train-images-idx3-ubyte", "--train-labels", dir + "/train-labels-idx1-ubyte",
         "--test-images", dir + "/t10k-images-idx3-ubyte", "--test-labels",
         dir + "/t10k-labels-idx1-ubyte"},
        {std::string("KILN_TOKEN=") + token}, absl::Seconds(60));
  };
  RunResult first = upload(kAlice, "vis-1");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  RunResult second = upload(kAlice, "vis-2");
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_THAT(second.err, HasSubstr("RESOURCE_EXHAUSTED"));
  EXPECT_THAT(second.err, HasSubstr("team vision stores"));
  EXPECT_THAT(second.err, HasSubstr("(--team_max_storage_bytes)"));
  // Another team's quota is its own.
  RunResult other = upload(kCarol, "speech-1");
  EXPECT_EQ(other.exit_code, 0) << other.err;
  auto stub = v1::Training::NewStub(kiln::testing::ConnectedChannel(kilnd.address()));
  v1::ListDatasetsResponse datasets;
  ASSERT_OK(
      stub->ListDatasets(ContextWithToken(kAlice).get(), v1::ListDatasetsRequest(), &datasets));
  ASSERT_EQ(datasets.datasets_size(), 1) << "the refused upload published nothing";
  auto scrape = ScrapeMetrics(kilnd.metrics_port());
  ASSERT_OK(scrape) << scrape.status();
  EXPECT_EQ(SampleValue(*scrape, "kiln_quota_refusals_total{quota=\"storage\",team=\"vision\"}"),
            1);
  kilnd.Stop();
  std::filesystem::remove_all(root);
}

TEST(TeamAccessStartupTest, ABareTokenIsAnAdminAndTheLogSaysSo) {
  const std::string root = MakeTempDir("kiln-bare");
  std::filesystem::create_directories(root + "/data");
  WriteFile(root + "/tokens", "tok-old-style\n");
  KilndUnderTest kilnd(root);
  ASSERT_TRUE(kilnd.Start({"--auth_tokens_file=" + root + "/tokens"})) << kilnd.Stderr();
  EXPECT_THAT(kilnd.Stderr(), HasSubstr("auth_tokens_without_identity"));
  auto stub = v1::Training::NewStub(kiln::testing::ConnectedChannel(kilnd.address()));
  v1::WhoAmIResponse me;
  ASSERT_OK(stub->WhoAmI(ContextWithToken("tok-old-style").get(), v1::WhoAmIRequest(), &me));
  EXPECT_EQ(me.role(), "admin");
  EXPECT_EQ(me.user(), "admin");
  kilnd.Stop();
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace kiln::security::testing
