// A bounded soak of kilnd on loopback: for KILN_SOAK_SECONDS (default 30) every kind of work at
// once, over and over: paced inference, watchers replaying a job's whole step history, dataset
// uploads listed and deleted, job lifecycles (submit, resume from a named checkpoint, delete
// a checkpoint, deploy and undeploy it), the HTTP port (REST inference, /metrics, the web API,
// its event stream and a checkpoint download) and the Workers service (data-parallel jobs of two
// kiln-worker processes, with forged joins and abandoned rendezvous waits beside them). Asserted at
// the end: no operation failed, kilnd's resident memory in the last fifth of the run is within a
// bound of the second fifth's, and its open descriptors are back to what they were once the clients
// have gone. Printed: the operations done and the RSS and descriptor counts (for bench/RESULTS.md).
#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "gtest/gtest.h"
#include "hardening_test_support.h"
#include "inference/grpc_service.grpc.pb.h"
#include "kiln/v1/worker.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "server_test_support.h"
#include "serving_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::server {
namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kInferenceClients = 8;
constexpr int kWatchers = 4;
// Growth allowed from the second fifth of the run to the last (medians of 200 ms samples; the
// first fifth warms up), and kilnd's resident memory at the end. 30 s here: 42.8, 44.8, 47.6,
// 50.1, 50.7 MiB by fifth. Before kilnd fixed glibc's mmap threshold (server/main.cc), every
// per-thread arena filled: 66, 80, 84, 94, 96 MiB, and 922 MB after 1,137 short jobs.
constexpr int64_t kRssGrowthBytes = int64_t{24} << 20;
constexpr int64_t kRssEndBytes = int64_t{160} << 20;
// Descriptors kilnd may hold at the end beyond those at the start (a connection or two still
// closing, the store's WAL).
constexpr int kDescriptorSlack = 8;
// Between two job lifecycles: a few jobs a second, still far more than a service sees.
constexpr auto kLifecyclePause = std::chrono::milliseconds(200);

int SoakSeconds() {
  const char* env = std::getenv("KILN_SOAK_SECONDS");
  int seconds = 30;
  if (env != nullptr && (!absl::SimpleAtoi(env, &seconds) || seconds < 5)) {
    ADD_FAILURE() << "KILN_SOAK_SECONDS=" << env << ": expected a number of seconds >= 5";
    seconds = 30;
  }
  return seconds;
}

// Which loads run: KILN_SOAK_LOADS, a comma-separated subset of infer, watch, upload, lifecycle
// (submit, train, resume, delete a checkpoint, deploy and undeploy), http and workers (default:
// all), to find which one grows kilnd when the test fails.
bool LoadOn(const char* load) {
  const char* env = std::getenv("KILN_SOAK_LOADS");
  if (env == nullptr || *env == '\0') return true;
  return absl::StrContains(absl::StrCat(",", env, ","), absl::StrCat(",", load, ","));
}

int64_t Median(std::vector<int64_t> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Operations done and failed, by kind; the first failure of each kind kept.
class Tally {
 public:
  // An operation that must be refused with `expected` (a forged token, an abandoned wait).
  void Refused(const std::string& kind, const grpc::Status& status, grpc::StatusCode expected) {
    Done(kind, status.error_code() == expected
                   ? grpc::Status::OK
                   : grpc::Status(grpc::StatusCode::INTERNAL,
                                  absl::StrCat("expected code ", static_cast<int>(expected),
                                               ", got ", static_cast<int>(status.error_code()),
                                               ": ", status.error_message())));
  }
  // An HTTP answer that must have `expected` status.
  void Http(const std::string& kind, const httplib::Result& res, int expected) {
    Done(kind,
         res && res->status == expected
             ? grpc::Status::OK
             : grpc::Status(grpc::StatusCode::INTERNAL,
                            res ? absl::StrCat("HTTP ", res->status, ": ", res->body)
                                : absl::StrCat("no answer: ", httplib::to_string(res.error()))));
  }
  void Done(const std::string& kind, const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = entries_[kind];
    if (status.ok()) {
      ++e.ok;
    } else if (e.failed++ == 0) {
      e.first_error =
          absl::StrCat(static_cast<int>(status.error_code()), ": ", status.error_message());
    }
  }
  void Check() {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [kind, e] : entries_) {
      std::printf("[ soak     ] %-12s %6lld ok, %lld failed\n", kind.c_str(),
                  static_cast<long long>(e.ok), static_cast<long long>(e.failed));
      EXPECT_EQ(e.failed, 0) << kind << ": first failure " << e.first_error;
      EXPECT_GT(e.ok, 0) << kind << " never succeeded";
    }
  }

 private:
  struct Entry {
    int64_t ok = 0, failed = 0;
    std::string first_error;
  };
  std::mutex mu_;
  std::map<std::string, Entry> entries_;
};

grpc::Status LoadModel(inference::GRPCInferenceService::Stub& stub, const std::string& name,
                       const std::string& checkpoint) {
  grpc::ClientContext context;
  inference::RepositoryModelLoadRequest request;
  request.set_model_name(name);
  (*request.mutable_parameters())["checkpoint"].set_string_param(checkpoint);
  inference::RepositoryModelLoadResponse response;
  return stub.RepositoryModelLoad(&context, request, &response);
}

grpc::Status UnloadModel(inference::GRPCInferenceService::Stub& stub, const std::string& name) {
  grpc::ClientContext context;
  inference::RepositoryModelUnloadRequest request;
  request.set_model_name(name);
  inference::RepositoryModelUnloadResponse response;
  return stub.RepositoryModelUnload(&context, request, &response);
}

// Uploads, listed and deleted, over and over.
void UploadLoad(const testing::KilndProcess& kilnd, Tally& tally, const std::atomic<bool>& stop) {
  auto own = kilnd.NewStub();
  const std::string images_idx = testing::ToyImagesIdx(200, 9);
  const std::string labels_idx = testing::ToyLabelsIdx(200, 9);
  for (int i = 0; !stop.load(); ++i) {
    const std::string name = absl::StrCat("soak-", i);
    v1::Dataset uploaded;
    tally.Done("upload",
               testing::Upload(*own, name,
                               {{"train-images-idx3-ubyte", images_idx, Sha256Hex(images_idx)},
                                {"train-labels-idx1-ubyte", labels_idx, Sha256Hex(labels_idx)}},
                               &uploaded));
    grpc::ClientContext list_context;
    v1::ListDatasetsResponse list;
    tally.Done("list", own->ListDatasets(&list_context, v1::ListDatasetsRequest(), &list));
    grpc::ClientContext delete_context;
    v1::DeleteDatasetRequest request;
    request.set_name(name);
    v1::DeleteDatasetResponse deleted;
    tally.Done("delete-data", own->DeleteDataset(&delete_context, request, &deleted));
  }
}

// Job lifecycles, over and over: submit and train, resume from the first checkpoint, deploy and
// undeploy the result, delete that checkpoint.
void LifecycleLoad(const testing::KilndProcess& kilnd, Tally& tally,
                   const std::atomic<bool>& stop) {
  auto own = kilnd.NewStub();
  auto own_admin = inference::GRPCInferenceService::NewStub(
      grpc::CreateChannel(kilnd.address(), grpc::InsecureChannelCredentials()));
  v1::JobSpec spec = testing::SmallSpec("toy", 2);
  spec.mutable_checkpoint_policy()->set_every_n_epochs(1);
  while (!stop.load()) {
    grpc::ClientContext submit_context;
    v1::SubmitJobRequest submit;
    *submit.mutable_spec() = spec;
    v1::Job job;
    const grpc::Status submitted = own->SubmitJob(&submit_context, submit, &job);
    tally.Done("submit", submitted);
    if (!submitted.ok()) break;
    const bool ended =
        testing::WaitForState(*own, job.id(), v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
    tally.Done("succeed", ended ? grpc::Status::OK
                                : grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, job.id()));
    if (!ended) break;
    const std::vector<v1::Checkpoint> checkpoints = testing::ListCheckpoints(*own, job.id());
    if (checkpoints.empty()) break;
    grpc::ClientContext resume_context;
    v1::ResumeJobRequest resume;
    resume.set_job_id(job.id());
    resume.set_epochs(3);
    resume.set_checkpoint_id(checkpoints.front().id());
    tally.Done("resume", own->ResumeJob(&resume_context, resume, &job));
    testing::WaitForState(*own, job.id(), v1::JOB_STATE_SUCCEEDED, absl::Seconds(60));
    tally.Done("deploy", LoadModel(*own_admin, "cycle", absl::StrCat(job.id(), "@latest")));
    tally.Done("undeploy", UnloadModel(*own_admin, "cycle"));
    grpc::ClientContext delete_context;
    v1::DeleteCheckpointRequest del;
    del.set_job_id(job.id());
    del.set_checkpoint_id(checkpoints.front().id());
    v1::Checkpoint gone;
    tally.Done("delete-ckpt", own->DeleteCheckpoint(&delete_context, del, &gone));
    std::this_thread::sleep_for(kLifecyclePause);
  }
}

// The HTTP port, over and over: REST inference of one image (JSON), a /metrics scrape, the web
// API's job list, its jobs feed read for a moment and dropped, and a download of `checkpoint_path`
// whole (`checkpoint_bytes` long).
void HttpLoad(int port, const std::vector<uint8_t>& image, const std::string& checkpoint_path,
              int64_t checkpoint_bytes, Tally& tally, const std::atomic<bool>& stop) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(10, 0);
  const std::string infer = nlohmann::json{
      {"inputs",
       {{{"name", "input"},
         {"datatype", "UINT8"},
         {"shape", {1, static_cast<int64_t>(image.size())}},
         {"data", image}}}}}.dump();
  while (!stop.load()) {
    tally.Http("http-infer", client.Post("/v2/models/digits/infer", infer, "application/json"),
               200);
    tally.Http("http-metrics", client.Get("/metrics"), 200);
    tally.Http("http-jobs", client.Get("/api/jobs"), 200);
    const absl::Time until = absl::Now() + absl::Milliseconds(500);
    bool opened = false;
    client.Get("/api/events", [&](const char* data, size_t n) {
      opened = opened || absl::StrContains(absl::string_view(data, n), "event: open");
      return absl::Now() < until;
    });
    tally.Done("http-stream", opened ? grpc::Status::OK
                                     : grpc::Status(grpc::StatusCode::INTERNAL, "no open event"));
    httplib::Result file = client.Get(checkpoint_path);
    tally.Http("http-download", file, 200);
    if (file && file->status == 200 &&
        static_cast<int64_t>(file->body.size()) != checkpoint_bytes) {
      tally.Done("http-download", grpc::Status(grpc::StatusCode::DATA_LOSS,
                                               absl::StrCat(file->body.size(), " bytes")));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// The Workers service, over and over: a job of two kiln-worker processes trained to the end,
// and while it runs, a join with a forged token (UNAUTHENTICATED) and a rendezvous wait for a
// key nobody sets, abandoned by its deadline (DEADLINE_EXCEEDED).
void WorkersLoad(const testing::KilndProcess& kilnd, Tally& tally, const std::atomic<bool>& stop) {
  auto training = kilnd.NewStub();
  auto workers = v1::Workers::NewStub(
      grpc::CreateChannel(kilnd.address(), grpc::InsecureChannelCredentials()));
  v1::JobSpec spec = testing::SmallSpec("toy", 1);
  spec.set_workers(2);
  for (int i = 0; !stop.load(); ++i) {
    const std::string job = testing::SubmitJob(*training, spec);
    grpc::ClientContext token_context;
    v1::GetWorkerTokenRequest token_request;
    token_request.set_job_id(job);
    v1::GetWorkerTokenResponse token;
    tally.Done("worker-token", training->GetWorkerToken(&token_context, token_request, &token));
    v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
    for (;;) {
      state = testing::GetJob(*training, job).state();
      if (state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
          state == v1::JOB_STATE_CANCELLED) {
        break;
      }
      grpc::ClientContext forged;
      forged.AddMetadata("x-kiln-worker-token", "forged-token");
      v1::JoinJobRequest join;
      join.set_job_id(job);
      v1::JoinJobResponse joined;
      tally.Refused("worker-forged", workers->JoinJob(&forged, join, &joined),
                    grpc::StatusCode::UNAUTHENTICATED);
      grpc::ClientContext waiting;
      waiting.AddMetadata("x-kiln-worker-token", token.token());
      waiting.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
      v1::GetKeyRequest get;
      get.set_job_id(job);
      get.set_key(absl::StrCat("soak-never-set-", i));
      get.set_timeout_ms(60000);
      v1::GetKeyResponse got;
      const grpc::Status wait = workers->GetKey(&waiting, get, &got);
      // Between attempts or after the job's end there is nothing to wait on (FAILED_PRECONDITION),
      // and a wait the attempt's end cuts is ABORTED.
      if (wait.error_code() != grpc::StatusCode::FAILED_PRECONDITION &&
          wait.error_code() != grpc::StatusCode::ABORTED) {
        tally.Refused("worker-wait", wait, grpc::StatusCode::DEADLINE_EXCEEDED);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    tally.Done("worker-job",
               state == v1::JOB_STATE_SUCCEEDED
                   ? grpc::Status::OK
                   : grpc::Status(grpc::StatusCode::INTERNAL,
                                  absl::StrCat(job, " ended ", v1::JobState_Name(state))));
  }
}

TEST(SoakTest, EveryKindOfWorkAtOnceLeavesMemoryAndDescriptorsFlat) {
  const int seconds = SoakSeconds();
  const std::string root = testing::MakeTempDir("kilnd-soak");
  testing::WriteToyDataset(root + "/data/toy", 256, 64);
  const std::vector<std::string> args = {"--max_jobs_per_device=2", "--metrics_max_ended_jobs=20"};
  testing::KilndProcess kilnd(root + "/state", root + "/data", args);
  ASSERT_TRUE(kilnd.KilndChild::Start(root + "/state", root + "/data", args, /*metrics=*/true));
  auto stub = kilnd.NewStub();
  auto admin = inference::GRPCInferenceService::NewStub(
      grpc::CreateChannel(kilnd.address(), grpc::InsecureChannelCredentials()));

  // A finished job: its history is what the watchers replay, its checkpoint the served model.
  v1::JobSpec base_spec = testing::SmallSpec("toy", 6);
  const std::string base = testing::SubmitJob(*stub, base_spec);
  ASSERT_TRUE(testing::WaitForState(*stub, base, v1::JOB_STATE_SUCCEEDED, absl::Seconds(120)));
  ASSERT_OK(LoadModel(*admin, "digits", base + "@latest"));
  const std::vector<v1::Checkpoint> base_checkpoints = testing::ListCheckpoints(*stub, base);
  ASSERT_FALSE(base_checkpoints.empty());
  const int descriptors_start = hardening::OpenDescriptors(kilnd.pid());

  Tally tally;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  const std::vector<uint8_t> images = serving::testing::SampleImages(kInferenceClients, 5);
  for (int c = 0; c < (LoadOn("infer") ? kInferenceClients : 0); ++c) {
    threads.emplace_back([&, c] {
      auto own = inference::GRPCInferenceService::NewStub(
          grpc::CreateChannel(kilnd.address(), grpc::InsecureChannelCredentials()));
      const inference::ModelInferRequest request =
          serving::testing::MakeRequest("digits", images.data() + c * serving::testing::kPixels, 1,
                                        "UINT8", serving::testing::Form::kRaw);
      while (!stop.load()) {
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        inference::ModelInferResponse response;
        tally.Done("infer", own->ModelInfer(&context, request, &response));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }
  for (int w = 0; w < (LoadOn("watch") ? kWatchers : 0); ++w) {
    threads.emplace_back([&] {
      auto own = kilnd.NewStub();
      while (!stop.load()) {
        const testing::WatchResult r = testing::WatchToEnd(*own, base, /*include_steps=*/true);
        tally.Done("watch", r.status);
      }
    });
  }
  if (LoadOn("upload")) threads.emplace_back([&] { UploadLoad(kilnd, tally, stop); });
  if (LoadOn("lifecycle")) threads.emplace_back([&] { LifecycleLoad(kilnd, tally, stop); });
  if (LoadOn("http")) {
    threads.emplace_back([&] {
      const v1::Checkpoint& checkpoint = base_checkpoints.back();
      HttpLoad(kilnd.metrics_port(),
               std::vector<uint8_t>(images.begin(), images.begin() + serving::testing::kPixels),
               absl::StrCat("/api/jobs/", base, "/checkpoints/", checkpoint.id(), "/file"),
               checkpoint.size_bytes(), tally, stop);
    });
  }
  if (LoadOn("workers")) threads.emplace_back([&] { WorkersLoad(kilnd, tally, stop); });

  std::vector<std::pair<double, int64_t>> rss;  // (seconds into the soak, bytes)
  const auto start = Clock::now();
  while (Clock::now() - start < std::chrono::seconds(seconds)) {
    rss.emplace_back(std::chrono::duration<double>(Clock::now() - start).count(),
                     hardening::ResidentBytes(kilnd.pid()));
    tally.Done("health", hardening::HealthServing(kilnd.port())
                             ? grpc::Status::OK
                             : grpc::Status(grpc::StatusCode::UNAVAILABLE, "not serving"));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  stop = true;
  for (std::thread& t : threads) t.join();
  threads.clear();

  tally.Check();
  std::vector<int64_t> fifths[5];
  for (const auto& [t, bytes] : rss)
    fifths[std::min(4, static_cast<int>(t * 5 / seconds))].push_back(bytes);
  std::printf("[ soak     ] kilnd RSS by fifth of the run (medians, MiB):");
  for (const auto& fifth : fifths) std::printf(" %.1f", Median(fifth) / 1048576.0);
  std::printf("\n");
  const int64_t rss_first = Median(fifths[1]), rss_last = Median(fifths[4]);
  // The clients' connections are gone: kilnd closes its ends as it sees them close.
  int descriptors_end = -1;
  testing::WaitFor(
      [&] {
        descriptors_end = hardening::OpenDescriptors(kilnd.pid());
        return descriptors_end <= descriptors_start + kDescriptorSlack;
      },
      absl::Seconds(10));
  std::printf(
      "[ soak     ] %d s: kilnd RSS %.1f MiB (second fifth) -> %.1f MiB (last fifth); "
      "descriptors %d -> %d\n",
      seconds, rss_first / 1048576.0, rss_last / 1048576.0, descriptors_start, descriptors_end);
  EXPECT_LT(rss_last - rss_first, kRssGrowthBytes);
  EXPECT_LT(rss_last, kRssEndBytes);
  EXPECT_LE(descriptors_end, descriptors_start + kDescriptorSlack);
  EXPECT_TRUE(hardening::HealthServing(kilnd.port()));
  std::error_code ec;
  fs::remove_all(root, ec);
}

}  // namespace
}  // namespace kiln::server
