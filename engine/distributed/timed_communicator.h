// A Communicator that forwards every call to another and adds up the wall seconds and the bytes
// of its AllreduceSum calls, so that a rank can report how long a step's gradient allreduce took
// and how much it moved. Not thread-safe: collectives run on the training thread, and the totals
// are read and reset there between steps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "engine/distributed/communicator.h"

namespace kiln {

class TimedCommunicator final : public Communicator {
 public:
  // Wraps `inner`, which it owns.
  explicit TimedCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  DeviceKind device() const override { return inner_->device(); }
  // Timed and counted: count * sizeof(float) bytes, whether or not the call succeeded.
  absl::Status AllreduceSum(float* data, size_t count) override;
  // Forwarded untimed: they are not gradient traffic.
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status Barrier() override;

  // Wall seconds spent in AllreduceSum, and the bytes it reduced, since the last Reset.
  double allreduce_seconds() const { return allreduce_seconds_; }
  int64_t allreduce_bytes() const { return allreduce_bytes_; }
  void Reset();

 private:
  std::unique_ptr<Communicator> inner_;
  double allreduce_seconds_ = 0;
  int64_t allreduce_bytes_ = 0;
};

}  // namespace kiln
