// The memory all served versions together may plan to use (kilnd's --max_serving_memory_bytes):
// a load reserves its version's planned bytes before the expensive part starts, and the
// reservation lasts as long as the version is in memory. So two loads at once cannot both pass
// on the same room, and a version unloaded, pushed out by its policy or replaced gives its bytes
// back when it goes (after the requests still holding it finish).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/status/statusor.h"

namespace kiln::serving {

// What a budget holds now.
struct ServingMemoryUse {
  int64_t bytes = 0;          // reserved in all
  int versions = 0;           // versions in memory, loading ones included
  int64_t loading_bytes = 0;  // of `bytes`, reserved by loads under way
  int loading = 0;            // of `versions`, loads under way
};

class ServingMemoryBudget : public std::enable_shared_from_this<ServingMemoryBudget> {
 public:
  // One version's share: counted as loading until Loaded(), given back when destroyed. Holds
  // its budget alive, so a version may outlive the repository that loaded it.
  class Reservation {
   public:
    Reservation() = default;  // holds nothing
    Reservation(Reservation&& other) noexcept;
    Reservation& operator=(Reservation&& other) noexcept;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation() { Release(); }

    int64_t bytes() const { return bytes_; }
    // The version is in memory and ready: its bytes count as a loaded version's from now on.
    void Loaded();

   private:
    friend class ServingMemoryBudget;
    Reservation(std::shared_ptr<ServingMemoryBudget> budget, int64_t bytes)
        : budget_(std::move(budget)), bytes_(bytes) {}
    void Release();

    std::shared_ptr<ServingMemoryBudget> budget_;  // null: holds nothing
    int64_t bytes_ = 0;
    bool loading_ = true;
  };

  // A budget of `limit` bytes (at least 1).
  static std::shared_ptr<ServingMemoryBudget> Create(int64_t limit);

  int64_t limit() const { return limit_; }
  // `bytes` (not negative) more, when they fit beside what is held; otherwise RESOURCE_EXHAUSTED
  // naming the need, what is held (bytes, versions, loads under way), the limit and its flag.
  absl::StatusOr<Reservation> Reserve(int64_t bytes);
  ServingMemoryUse InUse() const;

 private:
  explicit ServingMemoryBudget(int64_t limit) : limit_(limit) {}

  const int64_t limit_;
  mutable std::mutex mu_;
  ServingMemoryUse use_;  // guarded by mu_
};

}  // namespace kiln::serving
