#include "server/checkpoints/checkpoint_policy.h"

namespace kiln::server {

CheckpointSettings TranslateCheckpointPolicy(const v1::CheckpointPolicy& policy) {
  CheckpointSettings s;
  s.every_n_epochs = policy.every_n_epochs();
  s.keep_last = policy.keep_last();
  s.keep_best = policy.keep_best();
  s.on_shutdown = !policy.has_on_shutdown() || policy.on_shutdown();
  return s;
}

std::vector<v1::CheckpointKind> CheckpointPolicy::AfterEpoch(int epoch, bool improved) const {
  std::vector<v1::CheckpointKind> kinds;
  if (settings_.every_n_epochs > 0 && epoch % settings_.every_n_epochs == 0) {
    kinds.push_back(v1::CHECKPOINT_KIND_PERIODIC);
  }
  if (settings_.keep_best && improved) kinds.push_back(v1::CHECKPOINT_KIND_BEST);
  return kinds;
}

std::vector<v1::Checkpoint> CheckpointPolicy::Redundant(const std::vector<v1::Checkpoint>& existing,
                                                        const v1::Checkpoint& added) const {
  std::vector<v1::Checkpoint> doomed;
  if (added.kind() == v1::CHECKPOINT_KIND_BEST) {
    for (const v1::Checkpoint& c : existing) {
      if (c.kind() == v1::CHECKPOINT_KIND_BEST && c.id() != added.id()) doomed.push_back(c);
    }
  }
  if (added.kind() == v1::CHECKPOINT_KIND_PERIODIC && settings_.keep_last > 0) {
    std::vector<v1::Checkpoint> periodic;
    for (const v1::Checkpoint& c : existing) {
      if (c.kind() == v1::CHECKPOINT_KIND_PERIODIC) periodic.push_back(c);
    }
    const int excess = static_cast<int>(periodic.size()) - settings_.keep_last;
    for (int i = 0; i < excess; ++i) doomed.push_back(periodic[i]);  // oldest first
  }
  return doomed;
}

}  // namespace kiln::server
