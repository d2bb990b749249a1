// A Communicator on NCCL for ranks that train on CUDA devices: collectives run on the CUDA
// backend's stream, in order with its ops, over device memory. The ranks meet through a
// KeyValueStore (rank 0 publishes NCCL's unique id). NCCL has no timeout of its own, so every
// call waits for its work under one: past it, the communicator is aborted (ncclCommAbort) and
// the call fails, naming the operation and this rank, instead of hanging the process. Teardown
// is bounded the same way: finalize under the timeout, then destroy; abort on an error or the
// timeout (destroy alone would wait for peers that may never come).
// Ranks get one through CreateCommunicator (engine/backend_registry.h).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/distributed/communicator.h"
#include "engine/distributed/key_value_store.h"

struct ncclComm;
struct CUevent_st;

namespace kiln {

class CudaBackend;
struct NcclLibrary;

struct NcclOptions {
  // The store key of the unique id: under a prefix per job and attempt when the store is shared.
  std::string unique_id_key = "nccl_unique_id";
  // Bounds the rendezvous, the communicator's creation, every collective and the finalize.
  absl::Duration timeout = absl::Seconds(60);
  // Called when ncclCommAbort has not returned within 10 s (it runs on a helper thread): NCCL
  // may still hold the GPU, and only ending the process frees it. Given the failure's message.
  // Unset, the abort is left running on its thread and the failure returned as usual.
  std::function<void(const std::string&)> on_stuck_abort;
};

class NcclCommunicator final : public Communicator {
 public:
  // Rank `rank` of `size` on `backend`'s device and stream (the backend must outlive this).
  // FailedPrecondition when NCCL cannot be loaded; DeadlineExceeded when the others do not join
  // within the timeout.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(KeyValueStore* store, int rank,
                                                                  int size, CudaBackend* backend,
                                                                  const NcclOptions& options = {});
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  DeviceKind device() const override { return DeviceKind::kCuda; }
  absl::Status AllreduceSum(float* data, size_t count) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status Barrier() override;

 private:
  NcclCommunicator(const NcclLibrary* nccl, int rank, int size, CudaBackend* backend,
                   const NcclOptions& options)
      : nccl_(nccl),
        rank_(rank),
        size_(size),
        backend_(backend),
        timeout_(options.timeout),
        on_stuck_abort_(options.on_stuck_abort) {}
  // Waits until NCCL has accepted the last call (a non-blocking communicator may still be
  // enqueueing) and, when `on_stream`, until the stream has run it; aborts on an error or the
  // timeout. The status names `what`.
  absl::Status Finish(const char* what, int result, bool on_stream);
  // Records the failure and aborts the communicator (bounded: see on_stuck_abort).
  absl::Status Fail(absl::Status status);
  // The destructor's teardown of a healthy communicator: finalize, then destroy, or abort.
  void Close();

  const NcclLibrary* nccl_;
  int rank_, size_;
  CudaBackend* backend_;
  absl::Duration timeout_;
  std::function<void(const std::string&)> on_stuck_abort_;
  ncclComm* comm_ = nullptr;  // null once destroyed or aborted
  CUevent_st* done_ = nullptr;  // recorded after each collective, polled under the timeout
  float* barrier_ = nullptr;    // one device float for Barrier's allreduce
  absl::Status failed_;
};

}  // namespace kiln
