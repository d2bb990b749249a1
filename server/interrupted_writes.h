// What a kilnd killed mid-write leaves behind, and its removal at the next start: checkpoint
// temp files (PATH.tmp.<pid>.<hex>, see engine/safetensors.cc) under the state dir, and dataset
// upload folders (.upload-<pid>-<hex>-<name>) in the data dir. Neither is ever read; both only
// take disk. An entry whose writer is still alive (another process) is left alone.
#pragma once

#include <string>

namespace kiln::server {

struct InterruptedWrites {
  int checkpoint_temps = 0;  // removed from <state_dir>/checkpoints/<job>/
  int upload_dirs = 0;       // removed from <data_dir>/
};

// The pid embedded in such a name, or -1 when the name is not one of them.
int CheckpointTempWriter(const std::string& file_name);
int UploadDirWriter(const std::string& dir_name);

// Removes every leftover whose writing process is gone. Our own pid counts as gone: nothing has
// been written by this process yet, and in a container every start can get the same pid.
InterruptedWrites RemoveInterruptedWrites(const std::string& state_dir,
                                          const std::string& data_dir);

}  // namespace kiln::server
