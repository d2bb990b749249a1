#include "server/jobs/metric_broadcaster.h"

#include <algorithm>
#include <utility>

namespace kiln::server {

bool Subscription::Pop(v1::JobEvent* event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (queue_.empty()) return false;
  *event = std::move(queue_.front());
  queue_.pop_front();
  event->set_dropped_before(dropped_pending_);
  dropped_pending_ = 0;
  return true;
}

bool Subscription::WaitPop(v1::JobEvent* event, absl::Duration timeout) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                 [&] { return !queue_.empty() || closed_; });
  }
  return Pop(event);
}

bool Subscription::Finished(absl::Status* status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_ || !queue_.empty()) return false;
  *status = close_status_;
  return true;
}

void Subscription::SetNotify(std::function<void()> notify) {
  std::lock_guard<std::mutex> lock(mu_);
  notify_ = std::move(notify);
}

int64_t Subscription::dropped_total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_total_;
}

std::function<void()> Subscription::Push(const v1::JobEvent& event) {
  if (event.has_step() && !include_steps_) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return nullptr;
  if (queue_.size() >= capacity_) {
    // Step events are the cheap ones to lose: epochs, checkpoints and states stay if they can.
    auto victim = std::find_if(queue_.begin(), queue_.end(),
                               [](const v1::JobEvent& e) { return e.has_step(); });
    if (victim == queue_.end() && event.has_step()) {
      ++dropped_pending_;
      ++dropped_total_;
      return nullptr;
    }
    queue_.erase(victim == queue_.end() ? queue_.begin() : victim);
    ++dropped_pending_;
    ++dropped_total_;
  }
  queue_.push_back(event);
  queue_.back().set_replayed(false);
  cv_.notify_all();
  return notify_;
}

std::function<void()> Subscription::Close(absl::Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return nullptr;
  closed_ = true;
  close_status_ = std::move(status);
  cv_.notify_all();
  return notify_;
}

std::shared_ptr<Subscription> MetricBroadcaster::Subscribe(const std::string& job_id,
                                                           bool include_steps) {
  auto subscription = std::make_shared<Subscription>(job_id, include_steps, buffer_events_);
  std::lock_guard<std::mutex> lock(mu_);
  subscribers_[job_id].push_back(subscription);
  return subscription;
}

void MetricBroadcaster::Unsubscribe(const std::shared_ptr<Subscription>& subscription) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = subscribers_.find(subscription->job_id());
  if (it == subscribers_.end()) return;
  std::erase(it->second, subscription);
  if (it->second.empty()) subscribers_.erase(it);
}

// Notify functions run under mu_ so that Unsubscribe() can promise none is still running.
void MetricBroadcaster::Publish(const std::string& job_id, const v1::JobEvent& event) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = subscribers_.find(job_id);
  if (it == subscribers_.end()) return;
  for (const auto& subscription : it->second) {
    if (auto notify = subscription->Push(event)) notify();
  }
}

void MetricBroadcaster::Close(const std::string& job_id, const absl::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = subscribers_.find(job_id);
  if (it == subscribers_.end()) return;
  for (const auto& subscription : it->second) {
    if (auto notify = subscription->Close(status)) notify();
  }
  subscribers_.erase(it);
}

void MetricBroadcaster::CloseAll(const absl::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [job_id, subscriptions] : subscribers_) {
    for (const auto& subscription : subscriptions) {
      if (auto notify = subscription->Close(status)) notify();
    }
  }
  subscribers_.clear();
}

size_t MetricBroadcaster::subscriber_count(const std::string& job_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = subscribers_.find(job_id);
  return it == subscribers_.end() ? 0 : it->second.size();
}

}  // namespace kiln::server
