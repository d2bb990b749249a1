#include "engine/cuda/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/device_guard.h"
#include "engine/cuda/nccl_library.h"

namespace kiln {

namespace {

// Between looks at a running collective: short, since a step waits on it.
constexpr auto kPoll = std::chrono::microseconds(20);

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

  auto comm = std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(nccl, rank, size, backend, options.timeout));
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
  if (comm_ != nullptr) {
    // A healthy communicator is destroyed; a failed one was aborted already.
    if (failed_.ok()) nccl_->CommDestroy(comm_);
  }
  if (done_ != nullptr) cudaEventDestroy(done_);
  if (barrier_ != nullptr) cudaFree(barrier_);
}

absl::Status NcclCommunicator::Fail(absl::Status status) {
  if (comm_ != nullptr) nccl_->CommAbort(comm_);  // frees the GPU from NCCL's kernels
  failed_ = std::move(status);
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
  bool recorded = false;
  while (true) {
    ncclResult_t async = ncclSuccess;
    if (comm_ != nullptr) nccl_->CommGetAsyncError(comm_, &async);
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
    std::this_thread::sleep_for(kPoll);
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
