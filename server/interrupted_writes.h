// What a kilnd killed mid-write leaves behind, and its removal at the next start: checkpoint
// temp files (SafetensorsTempWriterPid) under the state dir, and dataset upload folders
// (DatasetCatalog::UploadWriterPid) in the data dir. Neither is ever read; both only
// take disk. An entry whose writer is still alive (another process) is left alone.
#pragma once

#include <string>

namespace kiln::server {

struct InterruptedWrites {
  int checkpoint_temps = 0;  // removed from <state_dir>/checkpoints/<job>/
  int upload_dirs = 0;       // removed from <data_dir>/
};

// Removes every leftover whose writing process is gone. Our own pid counts as gone: nothing has
// been written by this process yet, and in a container every start can get the same pid.
InterruptedWrites RemoveInterruptedWrites(const std::string& state_dir,
                                          const std::string& data_dir);

}  // namespace kiln::server
