// The disk under --state_dir fills up while a job trains, and kilnd restarts on it while full.
// Before: the job was reported FAILED by the API but stayed RUNNING in the store (the state was
// announced before it was recorded), and after space returned it ran again and SUCCEEDED.
// Asserted now: what the API says about the job is what the store holds, also across a restart;
// training health is NOT_SERVING and new work UNAVAILABLE (naming the full disk) while the store
// refuses writes; kilnd starts on the full disk, read-only; and everything recovers by itself
// once space returns (a retried write succeeds), the job then resuming from its checkpoint.
//
// The full disk is a small tmpfs mounted over the state dir: needs root with CAP_SYS_ADMIN;
// skipped with a message elsewhere.
#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

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
using testing::SmallSpec;
using testing::WaitFor;

constexpr const char* kTraining = "kiln.v1.Training";

// Fills the filesystem holding `path` with one file until a write fails with ENOSPC; returns
// the bytes written.
int64_t FillWith(const std::string& path) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  std::vector<char> block(1 << 16, 'x');
  int64_t written = 0;
  for (;;) {
    const ssize_t n = write(fd, block.data(), block.size());
    if (n <= 0) break;
    written += n;
  }
  close(fd);
  return written;
}

class DiskFullTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::MakeTempDir("kilnd-disk-full");
    state_dir_ = root_ + "/state";
    testing::WriteToyDataset(root_ + "/data/toy", 256, 64);
    fs::create_directories(state_dir_);
    if (mount("tmpfs", state_dir_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=8m,mode=0755") !=
        0) {
      GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno)
                   << "; needs root with CAP_SYS_ADMIN): the full-disk fault is not tested";
    }
    mounted_ = true;
  }
  void TearDown() override {
    kilnd_.reset();
    if (mounted_) umount2(state_dir_.c_str(), MNT_DETACH);
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  void StartKilnd() {
    kilnd_ = std::make_unique<testing::KilndProcess>(
        state_dir_, root_ + "/data",
        std::vector<std::string>{"--step_delay=20ms", "--metrics_listen="});
    ASSERT_TRUE(kilnd_->Start()) << "kilnd did not start";
    stub_ = kilnd_->NewStub();
  }
  bool TrainingServing() { return hardening::HealthServing(kilnd_->port(), kTraining); }
  grpc::Status Submit() {
    grpc::ClientContext context;
    v1::SubmitJobRequest request;
    *request.mutable_spec() = SmallSpec("toy", 2);
    v1::Job job;
    return stub_->SubmitJob(&context, request, &job);
  }

  std::string root_, state_dir_;
  bool mounted_ = false;
  std::unique_ptr<testing::KilndProcess> kilnd_;
  std::unique_ptr<v1::Training::Stub> stub_;
};

TEST_F(DiskFullTest, ReadOnlyWhileFullTheSameJobStateEverywhereAndBackByItself) {
  ASSERT_NO_FATAL_FAILURE(StartKilnd());
  v1::JobSpec spec = SmallSpec("toy", 5000);
  spec.mutable_checkpoint_policy()->set_every_n_epochs(1);
  const std::string id = testing::SubmitJob(*stub_, spec);
  ASSERT_TRUE(
      WaitFor([&] { return !testing::ListCheckpoints(*stub_, id).empty(); }, absl::Seconds(60)));

  const std::string filler = state_dir_ + "/filler";
  const int64_t filled = FillWith(filler);
  ASSERT_GT(filled, 0);
  // The job's next writes fail; the store is read-only and training health says so.
  ASSERT_TRUE(WaitFor([&] { return !TrainingServing(); }, absl::Seconds(30)))
      << "training health stayed SERVING with the state dir full";
  EXPECT_TRUE(hardening::HealthServing(kilnd_->port())) << "the server as a whole is up";
  const grpc::Status refused = Submit();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("full"));
  const v1::Job announced = GetJob(*stub_, id);
  std::printf("[ full     ] %lld bytes filled; job %s while read-only: %s (%s)\n",
              static_cast<long long>(filled), id.c_str(),
              v1::JobState_Name(announced.state()).c_str(), announced.reason().c_str());

  // A restart on the full disk: kilnd starts, read-only, and the job is what it was announced.
  EXPECT_EQ(kilnd_->Stop(SIGTERM, absl::Seconds(30)), 0);
  ASSERT_NO_FATAL_FAILURE(StartKilnd());
  EXPECT_FALSE(TrainingServing());
  EXPECT_EQ(GetJob(*stub_, id).state(), announced.state())
      << "the API announced " << v1::JobState_Name(announced.state())
      << " before the restart; the store held something else";

  // Space returns: the retried writes succeed, health comes back, and the job resumes.
  fs::remove(filler);
  ASSERT_TRUE(WaitFor([&] { return TrainingServing(); }, absl::Seconds(30)))
      << "training health did not come back once space returned";
  v1::Job job;
  ASSERT_TRUE(WaitFor(
      [&] {
        job = GetJob(*stub_, id);
        // resumed_from_step is set once the checkpoint has loaded, after the state is RUNNING.
        return job.state() == v1::JOB_STATE_RUNNING && job.attempts() >= 2 &&
               job.resumed_from_step() > 0;
      },
      absl::Seconds(60)))
      << "it did not resume from its checkpoint: " << v1::JobState_Name(job.state()) << ", "
      << job.resumed_from_step() << ": " << job.reason();
  EXPECT_TRUE(Submit().ok());
  {
    grpc::ClientContext context;
    v1::CancelJobRequest request;
    request.set_job_id(id);
    v1::Job cancelled;
    ASSERT_TRUE(stub_->CancelJob(&context, request, &cancelled).ok());
  }
  ASSERT_TRUE(testing::WaitForState(*stub_, id, v1::JOB_STATE_CANCELLED, absl::Seconds(30)));
  EXPECT_EQ(kilnd_->Stop(SIGTERM, absl::Seconds(30)), 0);
  ASSERT_NO_FATAL_FAILURE(StartKilnd());
  EXPECT_EQ(GetJob(*stub_, id).state(), v1::JOB_STATE_CANCELLED);
}

}  // namespace
}  // namespace kiln::server
