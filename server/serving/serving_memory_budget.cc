#include "server/serving/serving_memory_budget.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"

namespace kiln::serving {

ServingMemoryBudget::Reservation::Reservation(Reservation&& other) noexcept
    : budget_(std::move(other.budget_)), bytes_(other.bytes_), loading_(other.loading_) {
  other.budget_ = nullptr;
  other.bytes_ = 0;
}

ServingMemoryBudget::Reservation& ServingMemoryBudget::Reservation::operator=(
    Reservation&& other) noexcept {
  if (this == &other) return *this;
  Release();
  budget_ = std::move(other.budget_);
  bytes_ = other.bytes_;
  loading_ = other.loading_;
  other.budget_ = nullptr;
  other.bytes_ = 0;
  return *this;
}

void ServingMemoryBudget::Reservation::Loaded() {
  if (budget_ == nullptr || !loading_) return;
  std::lock_guard<std::mutex> lock(budget_->mu_);
  budget_->use_.loading_bytes -= bytes_;
  budget_->use_.loading -= 1;
  loading_ = false;
}

void ServingMemoryBudget::Reservation::Release() {
  if (budget_ == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(budget_->mu_);
    ServingMemoryUse& use = budget_->use_;
    use.bytes -= bytes_;
    use.versions -= 1;
    if (loading_) {
      use.loading_bytes -= bytes_;
      use.loading -= 1;
    }
  }
  budget_ = nullptr;
  bytes_ = 0;
}

std::shared_ptr<ServingMemoryBudget> ServingMemoryBudget::Create(int64_t limit) {
  return std::shared_ptr<ServingMemoryBudget>(new ServingMemoryBudget(std::max<int64_t>(limit, 1)));
}

absl::StatusOr<ServingMemoryBudget::Reservation> ServingMemoryBudget::Reserve(int64_t bytes) {
  bytes = std::max<int64_t>(bytes, 0);
  std::lock_guard<std::mutex> lock(mu_);
  // use_.bytes <= limit_ always, so the difference cannot overflow.
  if (bytes > limit_ - use_.bytes) {
    const std::string budget = absl::StrCat(FormatBytes(limit_), " all served versions may use (",
                                            limit_, " bytes, --max_serving_memory_bytes)");
    if (use_.versions == 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("needs ", FormatBytes(bytes), " of memory, more than the ", budget));
    }
    const std::string loading = use_.loading == 0
                                    ? ""
                                    : absl::StrCat(" (", use_.loading, " of them loading now, ",
                                                   FormatBytes(use_.loading_bytes), ")");
    return absl::ResourceExhaustedError(absl::StrCat(
        "needs ", FormatBytes(bytes), " of memory, but the ", use_.versions,
        use_.versions == 1 ? " version" : " versions", " in memory", loading, " hold ",
        FormatBytes(use_.bytes), " of the ", budget, ": unload a version or a model to make room"));
  }
  use_.bytes += bytes;
  use_.versions += 1;
  use_.loading_bytes += bytes;
  use_.loading += 1;
  return Reservation(shared_from_this(), bytes);
}

ServingMemoryUse ServingMemoryBudget::InUse() const {
  std::lock_guard<std::mutex> lock(mu_);
  return use_;
}

}  // namespace kiln::serving
