#include "engine/distributed/timed_communicator.h"

#include <chrono>

namespace kiln {

absl::Status TimedCommunicator::AllreduceSum(float* data, size_t count) {
  // steady_clock: a wall-clock jump must not make a step's allreduce negative.
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = inner_->AllreduceSum(data, count);
  allreduce_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  allreduce_bytes_ += static_cast<int64_t>(count * sizeof(float));
  return status;
}

absl::Status TimedCommunicator::Broadcast(void* data, size_t bytes, int root) {
  return inner_->Broadcast(data, bytes, root);
}

absl::Status TimedCommunicator::Barrier() { return inner_->Barrier(); }

void TimedCommunicator::Reset() {
  allreduce_seconds_ = 0;
  allreduce_bytes_ = 0;
}

}  // namespace kiln
