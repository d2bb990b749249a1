#include "server/jobs/interrupted_writes.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "engine/model/safetensors.h"
#include "server/datasets/dataset_catalog.h"
#include "server/jobs/job_store.h"

namespace kiln::server {

namespace fs = std::filesystem;

namespace {

// A zombie (killed, not yet reaped by its parent) still answers kill(pid, 0): a kilnd restarted
// before the old one was reaped would keep its temp files until the start after.
bool IsZombie(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  // "<pid> (<comm>) <state> ...": comm may hold spaces and parentheses, the last ')' ends it.
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

bool WriterGone(int pid) {
  if (pid == static_cast<int>(::getpid())) return true;
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  return IsZombie(pid);
}

}  // namespace

InterruptedWrites RemoveInterruptedWrites(const std::string& state_dir,
                                          const std::string& data_dir) {
  InterruptedWrites removed;
  std::error_code ec;
  // Errors (a folder gone meanwhile, no permission) only mean less is removed: never fatal.
  for (const fs::directory_entry& job : fs::directory_iterator(state_dir + "/checkpoints", ec)) {
    if (!job.is_directory(ec)) continue;
    std::error_code job_ec;
    for (const fs::directory_entry& f : fs::directory_iterator(job.path(), job_ec)) {
      const int pid = SafetensorsTempWriterPid(f.path().filename().string());
      std::error_code rm_ec;
      if (pid > 0 && WriterGone(pid) && f.is_regular_file(rm_ec) && fs::remove(f.path(), rm_ec)) {
        ++removed.checkpoint_temps;
      }
    }
  }
  for (const fs::directory_entry& d : fs::directory_iterator(data_dir, ec)) {
    const int pid = DatasetCatalog::TempFolderWriterPid(d.path().filename().string());
    std::error_code rm_ec;
    if (pid > 0 && WriterGone(pid) && d.is_directory(rm_ec) &&
        fs::remove_all(d.path(), rm_ec) > 0 && !rm_ec) {
      ++removed.upload_dirs;
    }
  }
  return removed;
}

int RemoveUnrecordedCheckpoints(const std::string& state_dir, JobStore& store) {
  int removed = 0;
  std::error_code ec;
  for (const fs::directory_entry& job : fs::directory_iterator(state_dir + "/checkpoints", ec)) {
    if (!job.is_directory(ec)) continue;
    const std::string job_id = job.path().filename().string();
    // Only where the store answers for the job: an unknown job or a failed query removes nothing.
    if (!store.GetJob(job_id).ok()) continue;
    absl::StatusOr<std::vector<v1::Checkpoint>> recorded = store.Checkpoints(job_id);
    if (!recorded.ok()) continue;
    std::set<std::string> names;
    for (const v1::Checkpoint& c : *recorded) names.insert(fs::path(c.path()).filename().string());
    std::error_code job_ec;
    for (const fs::directory_entry& f : fs::directory_iterator(job.path(), job_ec)) {
      const std::string name = f.path().filename().string();
      std::error_code rm_ec;
      if (f.path().extension() == ".safetensors" && names.count(name) == 0 &&
          f.is_regular_file(rm_ec) && fs::remove(f.path(), rm_ec)) {
        ++removed;
      }
    }
  }
  return removed;
}

}  // namespace kiln::server
