#include "engine/cuda/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/device_guard.h"
#include "engine/cuda/nccl_library.h"

namespace kiln {

namespace {

// How a host thread waits on NCCL: it spins for the first kSpin (a step's collective is often
// done within microseconds, and one sleep costs 60-80 us with timer slack), then sleeps, doubling
// from kFirstSleep up to kMaxSleep.
constexpr absl::Duration kSpin = absl::Microseconds(200);
constexpr absl::Duration kFirstSleep = absl::Microseconds(10);
constexpr absl::Duration kMaxSleep = absl::Microseconds(500);
// The longest ncclCommAbort is waited for: it can block itself (on a peer's connection).
constexpr absl::Duration kAbortWait = absl::Seconds(10);

class Backoff {
 public:
  void Wait() {
    if (absl::Now() < spin_until_) return;  // spin: the caller looks again at once
    absl::SleepFor(sleep_);
    sleep_ = std::min(sleep_ * 2, kMaxSleep);
  }

 private:
  absl::Time spin_until_ = absl::Now() + kSpin;
  absl::Duration sleep_ = kFirstSleep;
};

// Runs ncclCommAbort on a helper thread and waits for it at most kAbortWait. False when it has
// not returned by then; it goes on running on its thread.
bool AbortWithin(const NcclLibrary* nccl, ncclComm* comm, int device) {
  auto returned = std::make_shared<std::promise<void>>();
  std::future<void> done = returned->get_future();
  std::thread([nccl, comm, device, returned] {
    CudaDeviceGuard guard(device);
    nccl->CommAbort(comm);
    returned->set_value();
  }).detach();
  return done.wait_for(absl::ToChronoMilliseconds(kAbortWait)) == std::future_status::ready;
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    KeyValueStore* store, int rank, int size, CudaBackend* backend, const NcclOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl: rank ", rank, " of ", size, " ranks is not a rank"));
  }
  KILN_ASSIGN_OR_RETURN(const NcclLibrary* nccl, Nccl());
  CudaDeviceGuard guard(backend->device());
  KILN_RETURN_IF_ERROR(guard.status());

  // Rank 0 draws the id; the others read it from the store.
  ncclUniqueId id;
  if (rank == 0) {
    const ncclResult_t got = nccl->GetUniqueId(&id);
    if (got != ncclSuccess) {
      return absl::UnavailableError(
          absl::StrCat("nccl: ncclGetUniqueId: ", nccl->GetErrorString(got)));
    }
    KILN_RETURN_IF_ERROR(
        store->Set(options.unique_id_key, std::string(id.internal, sizeof(id.internal))));
  } else {
    KILN_ASSIGN_OR_RETURN(const std::string bytes,
                          store->Get(options.unique_id_key, options.timeout));
    if (bytes.size() != sizeof(id.internal)) {
      return absl::DataLossError(absl::StrCat("nccl: the unique id under ", options.unique_id_key,
                                              " has ", bytes.size(), " bytes, not ",
                                              sizeof(id.internal)));
    }
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }

  auto comm =
      std::unique_ptr<NcclCommunicator>(new NcclCommunicator(nccl, rank, size, backend, options));
  KILN_CUDA_CHECK(cudaEventCreateWithFlags(&comm->done_, cudaEventDisableTiming));
  KILN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&comm->barrier_), sizeof(float)));
  // Non-blocking, so that a rank that never joins cannot hold this one inside NCCL: the
  // creation is polled under the timeout like every collective.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t init = nccl->CommInitRankConfig(&comm->comm_, size, id, rank, &config);
  KILN_RETURN_IF_ERROR(comm->Finish("communicator creation", init, /*on_stream=*/false));
  return comm;
}

NcclCommunicator::~NcclCommunicator() {
  CudaDeviceGuard guard(backend_->device());
  if (comm_ != nullptr) Close();  // a failed communicator was aborted already
  if (done_ != nullptr) cudaEventDestroy(done_);
  if (barrier_ != nullptr) cudaFree(barrier_);
}

void NcclCommunicator::Close() {
  // Finalize flushes this rank's outstanding work, polled under the timeout like a collective
  // (the communicator is non-blocking); destroy then only frees. On an error or the timeout,
  // Finish aborts instead.
  const ncclResult_t finalize = nccl_->CommFinalize(comm_);
  if (Finish("finalize", finalize, /*on_stream=*/false).ok()) {
    nccl_->CommDestroy(std::exchange(comm_, nullptr));
  }
}

absl::Status NcclCommunicator::Fail(absl::Status status) {
  failed_ = std::move(status);
  if (comm_ == nullptr) return failed_;
  // The abort frees the GPU from NCCL's kernels; bounded, since it can block itself.
  if (!AbortWithin(nccl_, std::exchange(comm_, nullptr), backend_->device())) {
    failed_ = absl::Status(failed_.code(),
                           absl::StrCat(failed_.message(), "; ncclCommAbort did not return within ",
                                        absl::FormatDuration(kAbortWait)));
    if (on_stuck_abort_) on_stuck_abort_(std::string(failed_.message()));
  }
  return failed_;
}

absl::Status NcclCommunicator::Finish(const char* what, int result, bool on_stream) {
  auto named = [&](const std::string& why) {
    return absl::StrCat("nccl ", what, " failed on rank ", rank_, " of ", size_, ": ", why);
  };
  if (result != ncclSuccess && result != ncclInProgress) {
    const char* last = comm_ != nullptr ? nccl_->GetLastError(comm_) : "";
    return Fail(absl::UnavailableError(
        named(absl::StrCat(nccl_->GetErrorString(static_cast<ncclResult_t>(result)), " ", last))));
  }
  const absl::Time deadline = absl::Now() + timeout_;
  Backoff backoff;
  bool recorded = false;
  while (true) {
    ncclResult_t async = ncclSuccess;
    if (comm_ != nullptr) {
      const ncclResult_t asked = nccl_->CommGetAsyncError(comm_, &async);
      if (asked != ncclSuccess) async = asked;  // a query that fails is no sign of health
    }
    if (async != ncclSuccess && async != ncclInProgress) {
      return Fail(absl::UnavailableError(
          named(absl::StrCat(nccl_->GetErrorString(async), " ", nccl_->GetLastError(comm_),
                             " (a rank has died or cannot be reached)"))));
    }
    if (async == ncclSuccess) {
      if (!on_stream) return absl::OkStatus();
      if (!recorded) {
        const cudaError_t rc = cudaEventRecord(done_, backend_->stream());
        if (rc != cudaSuccess) {
          return Fail(cuda_internal::CallError(rc, "cudaEventRecord", __FILE__, __LINE__));
        }
        recorded = true;
      }
      const cudaError_t q = cudaEventQuery(done_);
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) {
        return Fail(cuda_internal::CallError(q, "cudaEventQuery", __FILE__, __LINE__));
      }
    }
    if (absl::Now() >= deadline) {
      return Fail(absl::DeadlineExceededError(
          named(absl::StrCat("not done after ", absl::FormatDuration(timeout_),
                             " (a rank has died or hung); the communicator was aborted"))));
    }
    backoff.Wait();
  }
}

absl::Status NcclCommunicator::AllreduceSum(float* data, size_t count) {
  if (!failed_.ok()) return failed_;
  if (count == 0) return absl::OkStatus();
  CudaDeviceGuard guard(backend_->device());
  KILN_RETURN_IF_ERROR(guard.status());
  const ncclResult_t r =
      nccl_->AllReduce(data, data, count, ncclFloat32, ncclSum, comm_, backend_->stream());
  return Finish("allreduce", r, /*on_stream=*/true);
}

absl::Status NcclCommunicator::Broadcast(void* data, size_t bytes, int root) {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(absl::StrCat("nccl broadcast: root ", root, " of ", size_));
  }
  if (!failed_.ok()) return failed_;
  if (bytes == 0) return absl::OkStatus();
  CudaDeviceGuard guard(backend_->device());
  KILN_RETURN_IF_ERROR(guard.status());
  const ncclResult_t r =
      nccl_->Broadcast(data, data, bytes, ncclUint8, root, comm_, backend_->stream());
  return Finish("broadcast", r, /*on_stream=*/true);
}

absl::Status NcclCommunicator::Barrier() {
  // NCCL has no barrier: a one-float allreduce that every rank must join serves as one.
  if (!failed_.ok()) return failed_;
  return AllreduceSum(barrier_, 1);
}

}  // namespace kiln
