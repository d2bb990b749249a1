#include "server/jobs/event_replay.h"

#include <algorithm>
#include <utility>

#include "common/status_macros.h"

namespace kiln::server {

EventReplay::EventReplay(JobStore* store, std::string job_id, int64_t max_seq, bool include_steps,
                         int page_events)
    : store_(store),
      job_id_(std::move(job_id)),
      max_seq_(max_seq),
      include_steps_(include_steps),
      page_events_(std::max(1, page_events)) {}

absl::StatusOr<bool> EventReplay::Next(v1::JobEvent* event) {
  if (next_ == page_.size()) {
    if (last_page_) return false;
    page_.clear();
    next_ = 0;
    KILN_ASSIGN_OR_RETURN(
        page_, store_->EventsPage(job_id_, after_seq_, max_seq_, include_steps_, page_events_));
    // A short page is the last; a full one may be followed by an empty one.
    last_page_ = page_.size() < static_cast<size_t>(page_events_);
    if (page_.empty()) return false;
    after_seq_ = page_.back().seq();
  }
  *event = std::move(page_[next_++]);
  return true;
}

}  // namespace kiln::server
