// What a job's workers may report, checked at the edge before anything of it is recorded: steps
// and epochs within the job's plan (its epochs; the steps of an epoch from the dataset's size and
// the batch), each rank's moving forward, and finite, non-negative numbers. A worker holds the
// job's token, not kilnd's trust: a report outside this fails the attempt with a reason naming
// the rank and the field, and never reaches the store.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kiln/v1/worker.pb.h"

namespace kiln::server {

// What an attempt of a job is to train, as its reports must agree.
struct WorkerPlan {
  int world_size = 1;
  int epochs = 0;  // Job.epochs: the epochs trained to
  int batch_size = 0;
  int64_t steps_per_epoch = 0;  // ceil(train samples / batch)
  int64_t test_samples = 0;     // the dataset's test split
  // Where the attempt starts: its checkpoint's position (0 for none).
  int start_epochs_done = 0;
  int64_t start_global_step = 0;
};

// The steps of an epoch over `train_samples` in batches of `batch_size` (both at least 1).
int64_t StepsPerEpoch(int64_t train_samples, int batch_size);

// Not thread-safe: the runner of the attempt calls it under its lock.
class WorkerReportCheck {
 public:
  explicit WorkerReportCheck(const WorkerPlan& plan);

  // OK when `report` of `rank` (a step or an epoch; other kinds pass) is within the plan and
  // after the rank's last of its kind, which it then becomes. InvalidArgument naming the rank and
  // the field otherwise; FailedPrecondition for a loss that is not finite, as the engine says it.
  // `rank` must be in [0, world_size).
  absl::Status Check(int rank, const v1::WorkerReport& report);

 private:
  absl::Status CheckStep(int rank, const v1::WorkerStep& step);
  absl::Status CheckEpoch(int rank, const v1::EpochMetrics& epoch);

  const WorkerPlan plan_;
  const int64_t last_global_step_;  // of the whole plan (saturating)
  std::vector<int64_t> last_step_;  // by rank: the global_step of its last step
  std::vector<int> last_epoch_;     // by rank: its last epoch reported
};

}  // namespace kiln::server
