// Collectives among the ranks of a data-parallel job: every rank calls the same collectives in
// the same order, or they deadlock (here: time out). GlooCommunicator runs them over TCP on host
// memory, NcclCommunicator on a CUDA backend's device memory and stream.
//
// A collective that fails (a peer died, the network broke, the timeout passed) returns a Status
// naming the operation and this rank; the communicator is then spent and every later call
// returns that first error at once, so a job fails fast instead of hanging.
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "engine/backend.h"

namespace kiln {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // 0-based
  virtual int size() const = 0;  // ranks in the job
  // Where the buffers of the collectives live: host memory (kCpu) or the memory of the CUDA
  // backend the communicator was made for (kCuda).
  virtual DeviceKind device() const = 0;

  // data[0:count] = the element-wise sum of every rank's data[0:count], on every rank. The
  // summation order depends only on the world size, so every rank gets the same bits and a run
  // repeats bit for bit. Returns when data holds the result (for a device, in stream order).
  virtual absl::Status AllreduceSum(float* data, size_t count) = 0;
  // data[0:bytes] = root's data[0:bytes], on every rank.
  virtual absl::Status Broadcast(void* data, size_t bytes, int root) = 0;
  // Returns once every rank has entered the barrier.
  virtual absl::Status Barrier() = 0;
};

}  // namespace kiln
