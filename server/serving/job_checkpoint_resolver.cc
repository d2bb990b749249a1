#include "server/serving/job_checkpoint_resolver.h"

#include <cstdint>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kiln::serving {

CheckpointResolver MakeJobCheckpointResolver(CheckpointLister list_checkpoints) {
  return [list = std::move(list_checkpoints)](
             const std::string& source) -> absl::StatusOr<ResolvedCheckpoint> {
    const size_t at = source.find('@');
    const std::string job = source.substr(0, at);
    const std::string which = at == std::string::npos ? "latest" : source.substr(at + 1);
    if (job.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", source, "\" names no job; use JOB, JOB@latest, JOB@best or JOB@ID"));
    }
    int64_t id = 0;
    if (which != "latest" && which != "best" && (!absl::SimpleAtoi(which, &id) || id <= 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "\"", source, "\": after @ comes latest, best or a checkpoint id, not \"", which, "\""));
    }
    absl::StatusOr<std::vector<v1::Checkpoint>> checkpoints = list(job);
    if (!checkpoints.ok()) return checkpoints.status();
    if (checkpoints->empty()) {
      return absl::NotFoundError(absl::StrCat("job ", job, " has no checkpoints"));
    }
    const v1::Checkpoint* latest = &checkpoints->back();
    const v1::Checkpoint* best = &checkpoints->front();
    for (const v1::Checkpoint& c : *checkpoints) {
      if (c.test_accuracy() >= best->test_accuracy()) best = &c;
    }
    const v1::Checkpoint* chosen = which == "latest" ? latest : which == "best" ? best : nullptr;
    for (const v1::Checkpoint& c : *checkpoints) {
      if (chosen == nullptr && c.id() == id) chosen = &c;
    }
    if (chosen == nullptr) {
      return absl::NotFoundError(absl::StrCat("job ", job, " has no checkpoint ", id));
    }
    ResolvedCheckpoint resolved;
    resolved.path = chosen->path();
    resolved.sha256 = chosen->sha256();
    resolved.pinned_source = absl::StrCat(job, "@", chosen->id());
    if (chosen == latest) resolved.aliases.push_back("latest");
    if (chosen == best) resolved.aliases.push_back("best");
    return resolved;
  };
}

}  // namespace kiln::serving
