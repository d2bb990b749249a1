// Models that follow a training job: a deployment made with follow (e.g. of "JOB@best") gets a
// new version each time the job writes a checkpoint that its source now resolves to, loaded
// beside the current one, which answers until the new one is ready; the model's version policy
// then decides which versions stay.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "server/serving/inference_service.h"
#include "server/serving/model_repository.h"

namespace kiln::serving {

class ModelFollower {
 public:
  // Told of every attempt to follow: the model, the source, and the load's outcome.
  using OnFollow = std::function<void(const std::string& model, const std::string& source,
                                      const absl::Status& outcome)>;

  // `repository`, `service` and `resolver`'s targets must outlive the follower.
  ModelFollower(ModelRepository* repository, InferenceService* service, CheckpointResolver resolver,
                OnFollow on_follow = {});
  ~ModelFollower();  // Stop()
  ModelFollower(const ModelFollower&) = delete;
  ModelFollower& operator=(const ModelFollower&) = delete;

  // Job `job_id` recorded a checkpoint. Returns at once (callers may hold the job manager's
  // lock); the models following the job are looked at on the follower's own thread.
  void CheckpointWritten(const std::string& job_id);
  // Waits until every checkpoint told so far has been followed (for tests).
  void Drain();
  // Ends the thread after the work in hand; later checkpoints are ignored.
  void Stop();

 private:
  void Run();
  // Loads a new version of `model` when `source` resolves to a checkpoint other than its
  // default version's.
  void Follow(const std::string& model, const std::string& source);

  ModelRepository* repository_;
  InferenceService* service_;
  CheckpointResolver resolver_;
  OnFollow on_follow_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<std::string> jobs_;  // guarded by mu_
  bool busy_ = false;             // guarded by mu_: a job is being followed
  bool stopping_ = false;         // guarded by mu_
  std::thread thread_;
};

}  // namespace kiln::serving
