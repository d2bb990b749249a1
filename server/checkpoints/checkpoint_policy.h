// A job's checkpoint policy (every N epochs, keep the last K, keep the best, on shutdown) as the
// decisions a run makes: which checkpoints to write when, and which older ones a new one makes
// redundant. Pure: it writes and deletes nothing.
#pragma once

#include <vector>

#include "kiln/v1/training.pb.h"

namespace kiln::server {

// A policy's fields with its defaults applied.
struct CheckpointSettings {
  int every_n_epochs = 0;
  int keep_last = 0;
  bool keep_best = false;
  bool on_shutdown = true;
};

CheckpointSettings TranslateCheckpointPolicy(const v1::CheckpointPolicy& policy);

class CheckpointPolicy {
 public:
  explicit CheckpointPolicy(const v1::CheckpointPolicy& policy)
      : settings_(TranslateCheckpointPolicy(policy)) {}

  // The kinds to write, in order, once epoch `epoch` (from 1) has ended; `improved`: its score
  // is the job's best so far.
  std::vector<v1::CheckpointKind> AfterEpoch(int epoch, bool improved) const;
  // Whether a run stopped by a daemon shutdown writes a checkpoint first.
  bool OnShutdown() const { return settings_.on_shutdown; }
  // Of `existing` (the job's checkpoints, oldest first, `added` among them), those that `added`
  // makes redundant: after a BEST, every other BEST; after a PERIODIC, the oldest PERIODIC ones
  // beyond the last keep_last (none when keep_last is 0).
  std::vector<v1::Checkpoint> Redundant(const std::vector<v1::Checkpoint>& existing,
                                        const v1::Checkpoint& added) const;

 private:
  CheckpointSettings settings_;
};

}  // namespace kiln::server
