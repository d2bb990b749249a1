// A job's recorded events up to a seq, read from the store a page at a time: a watcher replaying
// a long history holds one page in memory, never the whole of it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/v1/training.pb.h"
#include "server/jobs/job_store.h"

namespace kiln::server {

// Not thread-safe: one reader (a WatchJob stream) pulls from it.
class EventReplay {
 public:
  // The job's events with seq <= max_seq (steps only with include_steps), read `page_events`
  // (at least 1) at a time. `store` is not owned and must outlive this.
  EventReplay(JobStore* store, std::string job_id, int64_t max_seq, bool include_steps,
              int page_events);

  // Moves the next event into *event: true; false once the history is exhausted. A store error
  // ends the replay.
  absl::StatusOr<bool> Next(v1::JobEvent* event);

  // Events read from the store and not yet taken: at most one page.
  size_t buffered() const { return page_.size() - next_; }

 private:
  JobStore* store_;
  const std::string job_id_;
  const int64_t max_seq_;
  const bool include_steps_;
  const int page_events_;
  std::vector<v1::JobEvent> page_;
  size_t next_ = 0;
  int64_t after_seq_ = 0;  // the last seq read
  bool last_page_ = false;
};

}  // namespace kiln::server
