// Fan-out of live job events to any number of subscribers, each with a bounded buffer, so that a
// slow or vanished subscriber never slows the trainer that publishes.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kiln/v1/training.pb.h"

namespace kiln::server {

// One subscriber's queue of live events for one job. Thread-safe.
class Subscription {
 public:
  Subscription(std::string job_id, bool include_steps, size_t capacity)
      : job_id_(std::move(job_id)), include_steps_(include_steps), capacity_(capacity) {}

  // Takes the next event, with dropped_before set to the events dropped since the last one
  // taken; false when none is buffered.
  bool Pop(v1::JobEvent* event);
  // Pop, waiting up to `timeout` for an event; false on timeout or once Finished.
  bool WaitPop(v1::JobEvent* event, absl::Duration timeout);
  // True once the job's stream was closed and every buffered event was taken; *status says why
  // it closed (OK when the job reached a final state).
  bool Finished(absl::Status* status);
  // Called (from the publishing thread, without this subscription's lock held) whenever an
  // event is buffered or the stream closes. Must not block.
  void SetNotify(std::function<void()> notify);

  int64_t dropped_total() const;
  const std::string& job_id() const { return job_id_; }

 private:
  friend class MetricBroadcaster;
  // Buffers an event, dropping the oldest step event (or else the oldest event) when full.
  // Returns the notify function to call.
  std::function<void()> Push(const v1::JobEvent& event);
  std::function<void()> Close(absl::Status status);

  const std::string job_id_;
  const bool include_steps_;
  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::JobEvent> queue_;
  int64_t dropped_pending_ = 0;
  int64_t dropped_total_ = 0;
  bool closed_ = false;
  absl::Status close_status_;
  std::function<void()> notify_;
};

class MetricBroadcaster {
 public:
  explicit MetricBroadcaster(size_t buffer_events = 1024) : buffer_events_(buffer_events) {}

  // A new subscription to the job's live events (steps only with include_steps).
  std::shared_ptr<Subscription> Subscribe(const std::string& job_id, bool include_steps);
  // Stops delivery to `subscription`; after return its notify function is never called again.
  void Unsubscribe(const std::shared_ptr<Subscription>& subscription);
  // Hands the event to every subscriber of the job; never blocks on a subscriber.
  void Publish(const std::string& job_id, const v1::JobEvent& event);
  // Ends the job's current subscriptions (after their buffered events) with `status`.
  void Close(const std::string& job_id, const absl::Status& status);
  // Ends every subscription, e.g. at shutdown.
  void CloseAll(const absl::Status& status);
  size_t subscriber_count(const std::string& job_id) const;

 private:
  const size_t buffer_events_;
  mutable std::mutex mu_;
  std::map<std::string, std::vector<std::shared_ptr<Subscription>>> subscribers_;
};

}  // namespace kiln::server
