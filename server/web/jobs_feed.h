// Which jobs changed, for the web page's live jobs table: a JobEventObserver that marks a job as
// changed on each of its events, and hands each listener (one Server-Sent-Event stream) the set
// of jobs changed since it last looked. A set, not a queue: a job's thousand steps are one entry,
// so a listener's memory is bounded by the number of jobs and a slow one never slows training.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/jobs/job_event_observer.h"

namespace kiln::web {

// Thread-safe.
class JobsFeed : public server::JobEventObserver {
 public:
  class Listener {
   public:
    // Moves the ids of the jobs changed since the last call into *job_ids, waiting up to
    // `timeout` for one; false when none changed meanwhile.
    bool WaitTake(std::set<std::string>* job_ids, absl::Duration timeout);

   private:
    friend class JobsFeed;
    void Mark(const std::string& job_id);

    std::mutex mu_;
    std::condition_variable cv_;
    std::set<std::string> changed_;
  };

  std::shared_ptr<Listener> Listen();
  // After return, `listener` is marked no more.
  void Forget(const std::shared_ptr<Listener>& listener);

  void OnSubmitted(const v1::Job& job) override;
  void OnStateChanged(const v1::Job& job, v1::JobState from) override;
  void OnStep(const std::string& job_id, const StepEvent& step, int64_t samples,
              double seconds) override;
  void OnEpoch(const std::string& job_id, const EpochEvent& epoch, int epochs) override;
  void OnCheckpoint(const v1::Checkpoint& checkpoint, double seconds) override;

 private:
  void Mark(const std::string& job_id);

  std::mutex mu_;
  std::vector<std::shared_ptr<Listener>> listeners_;
};

}  // namespace kiln::web
