#include "server/serving/model_follower.h"

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kiln::serving {

ModelFollower::ModelFollower(ModelRepository* repository, InferenceService* service,
                             CheckpointResolver resolver, OnFollow on_follow)
    : repository_(repository),
      service_(service),
      resolver_(std::move(resolver)),
      on_follow_(std::move(on_follow)),
      thread_([this] { Run(); }) {}

ModelFollower::~ModelFollower() { Stop(); }

void ModelFollower::CheckpointWritten(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;
  jobs_.push_back(job_id);
  changed_.notify_all();
}

void ModelFollower::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [this] { return (jobs_.empty() && !busy_) || stopping_; });
}

void ModelFollower::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    changed_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

void ModelFollower::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    changed_.wait(lock, [this] { return !jobs_.empty() || stopping_; });
    if (stopping_) return;
    const std::string job = jobs_.front();
    jobs_.pop_front();
    busy_ = true;
    lock.unlock();
    for (const auto& [model, source] : repository_->Following()) {
      // "JOB", "JOB@best", "JOB@latest": only the job that wrote the checkpoint.
      if (source == job || absl::StartsWith(source, job + "@")) Follow(model, source);
    }
    lock.lock();
    busy_ = false;
    changed_.notify_all();
  }
}

void ModelFollower::Follow(const std::string& model, const std::string& source) {
  absl::StatusOr<ResolvedCheckpoint> resolved = resolver_(source);
  absl::StatusOr<std::shared_ptr<const ServedVersion>> current = repository_->Find(model, "");
  if (!resolved.ok() || !current.ok()) return;  // nothing to follow, or the model went away
  if ((*current)->source() == resolved->pinned_source ||
      (*current)->checkpoint_path() == resolved->path) {
    return;  // the checkpoint it serves is still the one the source names
  }
  // The new version keeps the current one's settings; the service records it like any load.
  inference::RepositoryModelLoadRequest request =
      LoadRequestFor(model, source, (*current)->options());
  (*request.mutable_parameters())["follow"].set_string_param(source);
  const absl::Status outcome = service_->LoadModel(request);
  if (on_follow_) on_follow_(model, source, outcome);
}

}  // namespace kiln::serving
