// The state dir stops taking writes while a job checkpoints: the write fails, that job ends FAILED
// with a reason naming the checkpoint write, the previous checkpoint stays byte for byte as it
// was and still loads, and kilnd goes on serving: health, ListJobs, and a new job to success.
//
// Two ways to make writes fail, both working as root (where permission bits stop nothing):
// - a file-size limit (RLIMIT_FSIZE, lowered on the running kilnd with prlimit) below the
//   checkpoint's size: writes past it fail with EFBIG and raise SIGXFSZ, which kilnd ignores;
// - a full filesystem: a small tmpfs mounted over state_dir/checkpoints (needs the right to
//   mount; skipped with a message where the container refuses it).
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hardening_test_support.h"
#include "server_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::server {
namespace {
namespace fs = std::filesystem;
using testing::GetJob;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::SmallSpec;
using testing::WaitForState;

// A 784-3072-10 MLP with SGD momentum: 2.4 M parameters plus as many momentum values, so one
// checkpoint is 19.5 MB (18.6 MiB), far above what the store's files reach in these short runs (the
// WAL is checkpointed back at about 4 MB).
v1::JobSpec BigCheckpointSpec(int epochs) {
  v1::JobSpec spec = SmallSpec("toy", epochs);
  spec.mutable_model()->mutable_layers(0)->mutable_linear()->set_out_features(3072);
  spec.mutable_model()->mutable_layers(2)->mutable_linear()->set_in_features(3072);
  spec.mutable_checkpoint_policy()->set_every_n_epochs(1);
  return spec;
}
constexpr int64_t kBigCheckpointBytes = int64_t{18} << 20;  // at least this (about 18.6 MiB)

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// Whether process `pid` ignores `signal`, from the SigIgn mask in /proc/PID/status.
bool IgnoresSignal(pid_t pid, int signal) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("SigIgn:", 0) != 0) continue;
    const uint64_t mask = std::stoull(line.substr(7), nullptr, 16);
    return (mask >> (signal - 1)) & 1;
  }
  return false;
}

class CheckpointFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::MakeTempDir("kilnd-fault");
    state_dir_ = root_ + "/state";
    data_dir_ = root_ + "/data";
    testing::WriteToyDataset(data_dir_ + "/toy", 256, 64);
  }
  void TearDown() override {
    kilnd_.reset();  // nothing may hold files under a mount before it goes
    if (mounted_) umount2(checkpoints_mount_.c_str(), MNT_DETACH);
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  void StartKilnd() {
    // 8 steps an epoch with 50 ms after each: the test acts between two checkpoints.
    kilnd_ = std::make_unique<testing::KilndProcess>(
        state_dir_, data_dir_, std::vector<std::string>{"--step_delay=50ms", "--metrics_listen="});
    ASSERT_TRUE(kilnd_->Start()) << "kilnd did not start";
    stub_ = kilnd_->NewStub();
  }

  // Runs the big-checkpoint job until its first checkpoint is indexed, calls `inject` at once (an
  // epoch before the next checkpoint), and reads the job's events to the end. Returns the
  // checkpoint written before the fault and its bytes as they were right after `inject`.
  struct Outcome {
    std::string job_id;
    v1::Checkpoint previous;
    std::string previous_bytes;
    std::vector<v1::JobEvent> events;
    grpc::Status status;
  };
  Outcome RunIntoFault(const std::function<void()>& inject) {
    Outcome out;
    out.job_id = testing::SubmitJob(*stub_, BigCheckpointSpec(6));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    v1::WatchJobRequest request;
    request.set_job_id(out.job_id);
    auto reader = stub_->WatchJob(&context, request);
    v1::JobEvent event;
    bool injected = false;
    while (reader->Read(&event)) {
      if (!injected && event.has_checkpoint()) {
        inject();
        injected = true;
        out.previous = event.checkpoint();
        out.previous_bytes = ReadFile(out.previous.path());
      }
      out.events.push_back(event);
    }
    out.status = reader->Finish();
    EXPECT_TRUE(injected) << "the job wrote no checkpoint before it ended";
    return out;
  }

  // What must hold after the fault, whatever caused it. `error_text` is the errno's message.
  void ExpectFailedCleanlyAndServing(const Outcome& out, const std::string& error_text) {
    ASSERT_OK(out.status) << out.status.error_message();
    ASSERT_FALSE(out.events.empty());
    EXPECT_EQ(out.events.back().state().state(), v1::JOB_STATE_FAILED);
    const v1::Job job = GetJob(*stub_, out.job_id);
    EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
    std::printf("[ fault    ] job %s failed: %s\n", job.id().c_str(), job.reason().c_str());
    // "writing $state_dir/checkpoints/JOB/periodic-stepN-T.safetensors: write ...: <errno text>"
    // The path relative to the state dir: clients are not shown the server's layout.
    EXPECT_THAT(job.reason(), HasSubstr("writing $state_dir/checkpoints/" + job.id()));
    EXPECT_THAT(job.reason(), Not(HasSubstr(state_dir_)));
    EXPECT_THAT(job.reason(), HasSubstr(".safetensors"));
    EXPECT_THAT(job.reason(), HasSubstr(error_text));
    EXPECT_GT(job.global_step(), out.previous.global_step()) << "it failed at a later checkpoint";

    // The previous checkpoint: still the only one indexed, unchanged on disk, and loadable.
    ASSERT_GE(static_cast<int64_t>(out.previous_bytes.size()), kBigCheckpointBytes);
    const std::vector<v1::Checkpoint> listed = testing::ListCheckpoints(*stub_, out.job_id);
    ASSERT_EQ(listed.size(), 1u);
    EXPECT_EQ(listed[0].id(), out.previous.id());
    EXPECT_TRUE(ReadFile(out.previous.path()) == out.previous_bytes)
        << out.previous.path() << " changed";
    absl::StatusOr<TrainingPosition> position = hardening::LoadCheckpointForSpec(
        BigCheckpointSpec(6), data_dir_ + "/toy", out.previous.path());
    ASSERT_OK(position) << position.status();
    EXPECT_EQ(position->global_step, out.previous.global_step());
    // The failed write left nothing behind beside it.
    int files = 0;
    for (const auto& entry : fs::directory_iterator(fs::path(out.previous.path()).parent_path())) {
      ++files;
      EXPECT_EQ(entry.path().string(), out.previous.path()) << "left behind";
    }
    EXPECT_EQ(files, 1);

    // kilnd is still up and working.
    EXPECT_TRUE(hardening::HealthServing(kilnd_->port()));
    grpc::ClientContext context;
    v1::ListJobsRequest request;
    v1::ListJobsResponse response;
    ASSERT_OK(stub_->ListJobs(&context, request, &response));
    ASSERT_EQ(response.jobs_size(), 1);
    EXPECT_EQ(response.jobs(0).id(), out.job_id);
    EXPECT_EQ(response.jobs(0).state(), v1::JOB_STATE_FAILED);
    // A job whose checkpoints fit (about 200 KB each) runs to the end with the fault still there.
    const std::string next = testing::SubmitJob(*stub_, SmallSpec("toy", 2));
    ASSERT_TRUE(WaitForState(*stub_, next, v1::JOB_STATE_SUCCEEDED, absl::Seconds(60)))
        << GetJob(*stub_, next).reason();
    EXPECT_EQ(testing::ListCheckpoints(*stub_, next).size(), 1u) << "its final checkpoint";
  }

  std::string root_, state_dir_, data_dir_, checkpoints_mount_;
  bool mounted_ = false;
  std::unique_ptr<testing::KilndProcess> kilnd_;
  std::unique_ptr<v1::Training::Stub> stub_;
};

TEST_F(CheckpointFaultTest, FileSizeLimitDuringACheckpointFailsTheJobAndKeepsThePreviousOne) {
  ASSERT_NO_FATAL_FAILURE(StartKilnd());
  // Without this, the first write past the limit would kill kilnd (SIGXFSZ's default action).
  EXPECT_TRUE(IgnoresSignal(kilnd_->pid(), SIGXFSZ))
      << "kilnd must ignore SIGXFSZ (signal(SIGXFSZ, SIG_IGN) in server/main.cc)";
  const pid_t pid = kilnd_->pid();
  Outcome out = RunIntoFault([pid] {
    // 10 MiB: half a checkpoint, more than the store's files grow to here.
    rlimit limit{};
    ASSERT_EQ(prlimit(pid, RLIMIT_FSIZE, nullptr, &limit), 0) << std::strerror(errno);
    limit.rlim_cur = rlim_t{10} << 20;
    ASSERT_EQ(prlimit(pid, RLIMIT_FSIZE, &limit, nullptr), 0) << std::strerror(errno);
  });
  ExpectFailedCleanlyAndServing(out, std::strerror(EFBIG));
}

TEST_F(CheckpointFaultTest, FullFilesystemDuringACheckpointFailsTheJobAndKeepsThePreviousOne) {
  // 30 MiB holds the first checkpoint (19.5 MB) but not a second one beside it. The store stays
  // on the real disk, outside the mount.
  checkpoints_mount_ = state_dir_ + "/checkpoints";
  fs::create_directories(checkpoints_mount_);
  if (mount("tmpfs", checkpoints_mount_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV,
            "size=30m,mode=0755") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno)
                 << "; needs root with CAP_SYS_ADMIN): the full-filesystem fault is not tested";
  }
  mounted_ = true;
  ASSERT_NO_FATAL_FAILURE(StartKilnd());
  Outcome out = RunIntoFault([] {});
  ExpectFailedCleanlyAndServing(out, std::strerror(ENOSPC));
}

}  // namespace
}  // namespace kiln::server
