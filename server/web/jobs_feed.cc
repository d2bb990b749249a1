#include "server/web/jobs_feed.h"

#include <algorithm>
#include <chrono>

namespace kiln::web {

bool JobsFeed::Listener::WaitTake(std::set<std::string>* job_ids, absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [this] { return !changed_.empty(); });
  if (changed_.empty()) return false;
  job_ids->merge(changed_);
  changed_.clear();
  return true;
}

void JobsFeed::Listener::Mark(const std::string& job_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    changed_.insert(job_id);
  }
  cv_.notify_one();
}

std::shared_ptr<JobsFeed::Listener> JobsFeed::Listen() {
  auto listener = std::make_shared<Listener>();
  std::lock_guard<std::mutex> lock(mu_);
  listeners_.push_back(listener);
  return listener;
}

void JobsFeed::Forget(const std::shared_ptr<Listener>& listener) {
  std::lock_guard<std::mutex> lock(mu_);
  listeners_.erase(std::remove(listeners_.begin(), listeners_.end(), listener), listeners_.end());
}

void JobsFeed::Mark(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::shared_ptr<Listener>& listener : listeners_) listener->Mark(job_id);
}

void JobsFeed::OnSubmitted(const v1::Job& job) { Mark(job.id()); }
void JobsFeed::OnStateChanged(const v1::Job& job, v1::JobState) { Mark(job.id()); }
void JobsFeed::OnStep(const std::string& job_id, const StepEvent&, int64_t, double) {
  Mark(job_id);
}
void JobsFeed::OnEpoch(const std::string& job_id, const EpochEvent&, int) { Mark(job_id); }
void JobsFeed::OnCheckpoint(const v1::Checkpoint& checkpoint, double) { Mark(checkpoint.job_id()); }

}  // namespace kiln::web
