#include "server/web/long_answer_limit.h"

namespace kiln::web {

LongAnswerLimit::Slot::~Slot() {
  {
    std::lock_guard<std::mutex> lock(limit_->mu_);
    --limit_->open_;
  }
  limit_->closed_cv_.notify_all();
}

void LongAnswerLimit::Stop(absl::Duration grace) {
  std::unique_lock<std::mutex> lock(mu_);
  stopping_.store(true);
  closed_cv_.wait_for(lock, absl::ToChronoNanoseconds(grace), [this] { return open_ == 0; });
}

std::unique_ptr<LongAnswerLimit::Slot> LongAnswerLimit::Acquire() {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_.load() || open_ >= max_streams_) return nullptr;
  ++open_;
  return std::make_unique<Slot>(this);
}

int LongAnswerLimit::open_streams() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_;
}

}  // namespace kiln::web
