// How many long answers (Server-Sent-Event streams, checkpoint downloads) the web API holds open
// at once. Each holds one of the HTTP pool's threads for its life, so a bound keeps threads free
// for REST inference and the page; a request past it is answered 503. Also tells open streams
// when to end.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "absl/time/time.h"

namespace kiln::web {

// Thread-safe.
class LongAnswerLimit {
 public:
  explicit LongAnswerLimit(int max_streams) : max_streams_(max_streams) {}

  // Held by one open answer; gives its place back when destroyed.
  class Slot {
   public:
    explicit Slot(LongAnswerLimit* limit) : limit_(limit) {}
    ~Slot();
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

   private:
    LongAnswerLimit* limit_;
  };

  // A slot, or null when max_streams are open (or the limit is stopping).
  std::unique_ptr<Slot> Acquire();
  // Open streams see stopping() and end at their next turn; no new stream starts. Waits up to
  // `grace` for them to have ended, so that each ends with its last event rather than cut off
  // by the server's own stop.
  void Stop(absl::Duration grace);
  bool stopping() const { return stopping_.load(); }
  int open_streams() const;
  int max_streams() const { return max_streams_; }

 private:
  const int max_streams_;
  mutable std::mutex mu_;
  std::condition_variable closed_cv_;
  int open_ = 0;
  std::atomic<bool> stopping_{false};
};

}  // namespace kiln::web
