// A bound on the streaming calls (WatchJob, ExportCheckpoint, UploadDataset) open at once: each
// holds a slot from its handler until its reactor is done, so a client cannot pin unbounded
// threads, buffers and subscriptions by opening streams and never reading them.
#pragma once

#include <atomic>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace kiln::server {

class StreamSlots {
 public:
  // Held by a reactor; gives the slot back when destroyed.
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept : owner_(std::exchange(other.owner_, nullptr)) {}
    Slot& operator=(Slot&& other) noexcept {
      std::swap(owner_, other.owner_);
      return *this;
    }
    ~Slot() {
      if (owner_ != nullptr) owner_->open_.fetch_sub(1, std::memory_order_relaxed);
    }

   private:
    friend class StreamSlots;
    explicit Slot(StreamSlots* owner) : owner_(owner) {}
    StreamSlots* owner_ = nullptr;
  };

  // `flag`: the kilnd flag that sets `limit`, named when a stream is refused.
  explicit StreamSlots(int limit, std::string flag = "--max_streams")
      : limit_(limit), flag_(std::move(flag)) {}

  // A slot, or RESOURCE_EXHAUSTED naming the limit when `limit` streams are open.
  absl::StatusOr<Slot> Acquire() {
    if (open_.fetch_add(1, std::memory_order_relaxed) >= limit_) {
      open_.fetch_sub(1, std::memory_order_relaxed);
      return absl::ResourceExhaustedError(absl::StrCat(limit_,
                                                       " streaming calls are open, the limit (",
                                                       flag_, "); close one or try again later"));
    }
    return Slot(this);
  }

  int open() const { return open_.load(std::memory_order_relaxed); }

 private:
  const int limit_;
  const std::string flag_;
  std::atomic<int> open_{0};
};

}  // namespace kiln::server
