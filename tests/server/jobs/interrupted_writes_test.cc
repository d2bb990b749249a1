// Leftovers of a kilnd killed mid-write (checkpoint temp files, upload folders, checkpoint files
// the store does not list) go at the next start, and a second kilnd on a state dir in use is
// refused before it touches anything.
#include "server/jobs/interrupted_writes.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/model/safetensors.h"
#include "gtest/gtest.h"
#include "server/datasets/dataset_catalog.h"
#include "server/jobs/job_store.h"
#include "server/jobs/state_dir_lock.h"
#include "server_test_support.h"
#include "tests/support/status_matchers.h"

namespace kiln::server {
namespace {
namespace fs = std::filesystem;

void Touch(const std::string& path) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << "partial";
}

// A pid that certainly belongs to no process: a child that has exited and been reaped.
int DeadPid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  return static_cast<int>(child);
}

TEST(InterruptedWritesTest, NamesYieldTheirWritersPid) {
  EXPECT_EQ(SafetensorsTempWriterPid("latest-step40-1733.safetensors.tmp.4242.00ff00ff00ff00ff"),
            4242);
  EXPECT_EQ(SafetensorsTempWriterPid("latest-step40-1733.safetensors"), -1);
  EXPECT_EQ(SafetensorsTempWriterPid("notes.tmp.12.ab"), -1);
  EXPECT_EQ(SafetensorsTempWriterPid("x.safetensors.tmp..ab"), -1);
  EXPECT_EQ(DatasetCatalog::TempFolderWriterPid(".upload-977-0a0b0c0d-my-data.v2"), 977);
  EXPECT_EQ(DatasetCatalog::TempFolderWriterPid("mnist"), -1);
  EXPECT_EQ(DatasetCatalog::TempFolderWriterPid(".upload-x-0a0b0c0d-mnist"), -1);
  EXPECT_EQ(DatasetCatalog::TempFolderWriterPid(".deleting-978-0a0b0c0d-mnist"), 978);
  EXPECT_EQ(DatasetCatalog::TempFolderWriterPid(".deleted-978-0a0b0c0d-mnist"), -1);
}

TEST(InterruptedWritesTest, RemovesWhatDeadWritersLeftAndKeepsEverythingElse) {
  const std::string root = testing::MakeTempDir("interrupted-writes");
  const std::string state = root + "/state", data = root + "/data";
  const std::string ckpt = state + "/checkpoints/job-1/";
  const int dead = DeadPid(), me = static_cast<int>(getpid());
  const int live = static_cast<int>(getppid());  // the test runner's parent is alive
  Touch(ckpt + "latest-step5-100.safetensors");  // a finished checkpoint
  Touch(ckpt + "latest-step6-101.safetensors.tmp." + std::to_string(dead) + ".0000000000000001");
  Touch(ckpt + "best-step6-101.safetensors.tmp." + std::to_string(me) + ".0000000000000002");
  Touch(ckpt + "latest-step7-102.safetensors.tmp." + std::to_string(live) + ".0000000000000003");
  Touch(data + "/mnist/train-images-idx3-ubyte");
  Touch(data + "/.upload-" + std::to_string(dead) + "-00000001-fashion/train-labels-idx1-ubyte");
  Touch(data + "/.upload-" + std::to_string(live) + "-00000002-other/train-labels-idx1-ubyte");

  const InterruptedWrites removed = RemoveInterruptedWrites(state, data);
  EXPECT_EQ(removed.checkpoint_temps, 2);
  EXPECT_EQ(removed.upload_dirs, 1);
  EXPECT_TRUE(fs::exists(ckpt + "latest-step5-100.safetensors"));
  EXPECT_TRUE(fs::exists(ckpt + "latest-step7-102.safetensors.tmp." + std::to_string(live) +
                         ".0000000000000003"));
  EXPECT_FALSE(fs::exists(ckpt + "latest-step6-101.safetensors.tmp." + std::to_string(dead) +
                          ".0000000000000001"));
  EXPECT_TRUE(fs::exists(data + "/mnist/train-images-idx3-ubyte"));
  EXPECT_FALSE(fs::exists(data + "/.upload-" + std::to_string(dead) + "-00000001-fashion"));
  EXPECT_TRUE(fs::exists(data + "/.upload-" + std::to_string(live) + "-00000002-other"));
  // Missing folders are nothing to remove, not an error.
  const InterruptedWrites none = RemoveInterruptedWrites(root + "/absent", root + "/absent2");
  EXPECT_EQ(none.checkpoint_temps + none.upload_dirs, 0);
  fs::remove_all(root);
}

TEST(InterruptedWritesTest, CheckpointFilesTheStoreDoesNotListGoAndTheRestStay) {
  const std::string root = testing::MakeTempDir("unrecorded-checkpoints");
  const std::string state = root + "/state";
  auto store = JobStore::Open(root + "/kiln.db");
  ASSERT_OK(store) << store.status();
  v1::Job job;
  job.set_id("job-1");
  job.set_state(v1::JOB_STATE_RUNNING);
  ASSERT_OK((*store)->PutJob(job));
  const std::string ckpt = state + "/checkpoints/job-1/";
  // Recorded under another spelling of the same folder: matched by name, so it stays.
  v1::Checkpoint kept;
  kept.set_job_id("job-1");
  kept.set_path(state + "/./checkpoints/job-1/latest-step5-100.safetensors");
  ASSERT_OK((*store)->InsertCheckpoint(&kept));
  // Recorded, then deleted from the store: the unlink did not happen.
  v1::Checkpoint pruned = kept;
  pruned.set_path(ckpt + "latest-step3-90.safetensors");
  ASSERT_OK((*store)->InsertCheckpoint(&pruned));
  ASSERT_OK((*store)->DeleteCheckpoint(pruned.id()));
  Touch(ckpt + "latest-step5-100.safetensors");
  Touch(ckpt + "latest-step3-90.safetensors");
  Touch(ckpt + "best-step6-101.safetensors");  // renamed into place, never inserted
  Touch(ckpt + "notes.txt");                   // not a checkpoint
  Touch(state + "/checkpoints/job-unknown/latest-step1-1.safetensors");  // no such job

  EXPECT_EQ(RemoveUnrecordedCheckpoints(state, **store), 2);
  EXPECT_TRUE(fs::exists(ckpt + "latest-step5-100.safetensors"));
  EXPECT_FALSE(fs::exists(ckpt + "latest-step3-90.safetensors"));
  EXPECT_FALSE(fs::exists(ckpt + "best-step6-101.safetensors"));
  EXPECT_TRUE(fs::exists(ckpt + "notes.txt"));
  EXPECT_TRUE(fs::exists(state + "/checkpoints/job-unknown/latest-step1-1.safetensors"));
  EXPECT_EQ(RemoveUnrecordedCheckpoints(root + "/absent", **store), 0);
  fs::remove_all(root);
}

TEST(StateDirLockTest, OneHolderAtATime) {
  const std::string dir = testing::MakeTempDir("state-lock");
  {
    auto first = StateDirLock::Acquire(dir);
    ASSERT_OK(first) << first.status();
    auto second = StateDirLock::Acquire(dir);
    ASSERT_FALSE(second.ok());
    EXPECT_NE(second.status().message().find("in use by another kilnd (pid " +
                                             std::to_string(getpid()) + ")"),
              std::string::npos)
        << second.status();
  }
  EXPECT_OK(StateDirLock::Acquire(dir)) << "released when the holder goes";
  fs::remove_all(dir);
}

// The daemon itself: a second kilnd on the same state dir exits with the reason; the first,
// started over leftovers, has removed them.
TEST(StateDirLockTest, SecondKilndOnAStateDirIsRefusedAndTheFirstSweptLeftovers) {
  const std::string root = testing::MakeTempDir("kilnd-lock");
  const std::string state = root + "/state", data = root + "/data";
  const std::string temp = state + "/checkpoints/job-9/latest-step3-7.safetensors.tmp." +
                           std::to_string(DeadPid()) + ".00000000000000aa";
  Touch(temp);
  testing::WriteToyDataset(data + "/toy", 64, 16);
  testing::KilndProcess first(state, data, {});
  ASSERT_TRUE(first.Start());
  EXPECT_FALSE(fs::exists(temp));

  const std::string cmd = absl::StrCat(KILND_PATH, " --listen=127.0.0.1:0 --state_dir=", state,
                                       " --data_dir=", data, " --device=cpu 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  const int status = pclose(p);
  EXPECT_NE(WEXITSTATUS(status), 0);
  EXPECT_NE(out.find("is in use by another kilnd (pid " + std::to_string(first.pid()) + ")"),
            std::string::npos)
      << out;
  EXPECT_EQ(first.Stop(SIGTERM, absl::Seconds(20)), 0);
  fs::remove_all(root);
}

// A kilnd killed with SIGKILL stays a zombie until its parent reaps it; if the next kilnd starts
// before that, the dead writer's pid still answers kill(pid, 0). Its temp files must go anyway,
// not one restart later.
TEST(InterruptedWritesTest, AZombieWriterCountsAsGone) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  // Not reaped yet: a zombie, until waitpid below.
  ASSERT_TRUE(testing::WaitFor(
      [&] {
        std::ifstream stat("/proc/" + std::to_string(child) + "/stat");
        std::string pid, comm, state;
        stat >> pid >> comm >> state;
        return state == "Z";
      },
      absl::Seconds(10)));
  const std::string root = testing::MakeTempDir("interrupted-writes");
  const std::string ckpt = root + "/state/checkpoints/job-1/";
  const std::string temp =
      ckpt + "latest-step6-101.safetensors.tmp." + std::to_string(child) + ".0000000000000001";
  Touch(temp);
  Touch(root + "/data/.upload-" + std::to_string(child) + "-00000001-x/train-labels-idx1-ubyte");
  const InterruptedWrites removed = RemoveInterruptedWrites(root + "/state", root + "/data");
  EXPECT_EQ(removed.checkpoint_temps, 1);
  EXPECT_EQ(removed.upload_dirs, 1);
  EXPECT_FALSE(fs::exists(temp));
  waitpid(child, nullptr, 0);
  fs::remove_all(root);
}

}  // namespace
}  // namespace kiln::server
