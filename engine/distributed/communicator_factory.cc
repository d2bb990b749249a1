#include "engine/distributed/communicator_factory.h"

#include <utility>

#include "common/status_macros.h"
#include "engine/distributed/gloo_communicator.h"
#if defined(KILN_WITH_NCCL)
#include "engine/distributed/nccl_communicator.h"
#endif

namespace kiln {

absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    Backend* backend, KeyValueStore* store, int rank, int world_size,
    const CommunicatorOptions& options) {
  if (backend->kind() == DeviceKind::kCuda) {
#if defined(KILN_WITH_NCCL)
    NcclOptions nccl;
    nccl.timeout = options.timeout;
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> comm,
                          NcclCommunicator::Create(store, rank, world_size, backend, nccl));
    return std::unique_ptr<Communicator>(std::move(comm));
#else
    return absl::FailedPreconditionError(
        "this kiln-worker was built without NCCL, so it cannot train on a CUDA device with "
        "others");
#endif
  }
  GlooOptions gloo;
  gloo.hostname = options.gloo_hostname;
  gloo.interface = options.gloo_interface;
  gloo.timeout = options.timeout;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm,
                        GlooCommunicator::Create(store, rank, world_size, gloo));
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace kiln
