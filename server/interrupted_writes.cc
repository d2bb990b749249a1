#include "server/interrupted_writes.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string_view>

#include "absl/strings/numbers.h"

namespace kiln::server {

namespace fs = std::filesystem;

namespace {

// Digits up to `end` (npos: to the end of the name) as a pid, or -1.
int PidAt(std::string_view name, size_t begin, size_t end) {
  if (begin >= name.size()) return -1;
  std::string_view digits = name.substr(begin, end == std::string_view::npos ? end : end - begin);
  int pid = 0;
  if (digits.empty() || !absl::SimpleAtoi(absl::string_view(digits.data(), digits.size()), &pid) ||
      pid <= 0) {
    return -1;
  }
  return pid;
}

bool WriterGone(int pid) {
  if (pid == static_cast<int>(::getpid())) return true;
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

}  // namespace

int CheckpointTempWriter(const std::string& file_name) {
  // "<kind>-step<N>-<millis>.safetensors.tmp.<pid>.<16 hex>"
  constexpr std::string_view kMarker = ".safetensors.tmp.";
  const size_t at = file_name.rfind(kMarker);
  if (at == std::string::npos) return -1;
  const size_t begin = at + kMarker.size();
  const size_t dot = file_name.find('.', begin);
  if (dot == std::string::npos) return -1;
  return PidAt(file_name, begin, dot);
}

int UploadDirWriter(const std::string& dir_name) {
  constexpr std::string_view kPrefix = ".upload-";
  if (dir_name.rfind(kPrefix, 0) != 0) return -1;
  const size_t dash = dir_name.find('-', kPrefix.size());
  if (dash == std::string::npos) return -1;
  return PidAt(dir_name, kPrefix.size(), dash);
}

InterruptedWrites RemoveInterruptedWrites(const std::string& state_dir,
                                          const std::string& data_dir) {
  InterruptedWrites removed;
  std::error_code ec;
  // Errors (a folder gone meanwhile, no permission) only mean less is removed: never fatal.
  for (const fs::directory_entry& job : fs::directory_iterator(state_dir + "/checkpoints", ec)) {
    if (!job.is_directory(ec)) continue;
    std::error_code job_ec;
    for (const fs::directory_entry& f : fs::directory_iterator(job.path(), job_ec)) {
      const int pid = CheckpointTempWriter(f.path().filename().string());
      std::error_code rm_ec;
      if (pid > 0 && WriterGone(pid) && f.is_regular_file(rm_ec) && fs::remove(f.path(), rm_ec)) {
        ++removed.checkpoint_temps;
      }
    }
  }
  for (const fs::directory_entry& d : fs::directory_iterator(data_dir, ec)) {
    const int pid = UploadDirWriter(d.path().filename().string());
    std::error_code rm_ec;
    if (pid > 0 && WriterGone(pid) && d.is_directory(rm_ec) &&
        fs::remove_all(d.path(), rm_ec) > 0 && !rm_ec) {
      ++removed.upload_dirs;
    }
  }
  return removed;
}

}  // namespace kiln::server
