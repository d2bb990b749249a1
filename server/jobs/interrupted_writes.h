// What a kilnd killed mid-write leaves behind, and its removal at the next start: checkpoint
// temp files (SafetensorsTempWriterPid) under the state dir, and dataset upload and deletion
// folders (DatasetCatalog::TempFolderWriterPid) in the data dir. Neither is ever read; both only
// take disk. An entry whose writer is still alive (another process) is left alone. And finished
// checkpoint files that the store does not list: killed between the rename and the insert, or
// between the delete and the unlink.
#pragma once

#include <string>

namespace kiln::server {

class JobStore;

struct InterruptedWrites {
  int checkpoint_temps = 0;  // removed from <state_dir>/checkpoints/<job>/
  int upload_dirs = 0;       // removed from <data_dir>/
};

// Removes every leftover whose writing process is gone. Our own pid counts as gone: nothing has
// been written by this process yet, and in a container every start can get the same pid.
InterruptedWrites RemoveInterruptedWrites(const std::string& state_dir,
                                          const std::string& data_dir);

// Removes the .safetensors files in <state_dir>/checkpoints/<job>/ that `store` does not list
// for that job; a folder whose job the store does not know is left alone. Files are matched by
// name, so a state dir reached by another path spelling keeps its checkpoints. Runs before any
// job resumes; returns how many went.
int RemoveUnrecordedCheckpoints(const std::string& state_dir, JobStore& store);

}  // namespace kiln::server
