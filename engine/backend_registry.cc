#include "engine/backend_registry.h"

#include <omp.h>

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cuda/cuda_backend_options.h"  // no CUDA headers: in every build
#include "engine/distributed/gloo_communicator.h"
#if KILN_WITH_CUDA
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/cuda_device.h"
#endif
#if defined(KILN_WITH_NCCL)
#include "engine/cuda/nccl_communicator.h"
#endif

namespace kiln {

namespace {

int DeviceCount(std::string* why) {
#if KILN_WITH_CUDA
  return CudaDeviceCount(why);
#else
  if (why != nullptr) *why = "this build of kiln has no CUDA support";
  return 0;
#endif
}

// Parses "cuda:N" (or "cuda", meaning cuda:0) into N; -1 for "cpu"; error otherwise.
absl::StatusOr<int> ParseDevice(const std::string& device) {
  if (device == "cpu") return -1;
  if (device == "cuda") return 0;
  int index = 0;
  if (device.rfind("cuda:", 0) == 0 && absl::SimpleAtoi(device.substr(5), &index) && index >= 0) {
    return index;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device \"", device, "\" is not one of auto, cpu, cuda:N"));
}

}  // namespace

absl::Status ValidateDevice(std::string_view device_view) {
  // Debian's Abseil predates std::string_view interop: work on a std::string.
  const std::string device(device_view);
  if (device == "auto") return absl::OkStatus();
  KILN_ASSIGN_OR_RETURN(int index, ParseDevice(device));
  if (index < 0) return absl::OkStatus();
  std::string why;
  const int count = DeviceCount(&why);
  if (index >= count) {
    return absl::NotFoundError(absl::StrCat(
        "device ", device, " not found: ", count == 0 ? why : absl::StrCat(count, " CUDA devices"),
        " (available: ", absl::StrJoin(AvailableDevices(), ", "), ")"));
  }
  return absl::OkStatus();
}

int CpuBackendThreads(const BackendOptions& options) {
  // omp_get_num_procs: the count CpuBackend takes for "every core". More threads than cores only
  // slow the team down (and a client's threads=1024 would make a thousand), so asked for counts
  // are capped to it.
  const int cores = std::max(1, omp_get_num_procs());
  if (options.threads > 0) return std::min(options.threads, cores);
  return std::max(1, cores / std::max(1, options.shares));
}

absl::StatusOr<std::string> ResolveDevice(std::string_view device) {
  KILN_RETURN_IF_ERROR(ValidateDevice(device));
  if (device != "auto") return std::string(device);
  return DeviceCount(nullptr) > 0 ? "cuda:0" : "cpu";
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(std::string_view requested,
                                                       const BackendOptions& options) {
  KILN_ASSIGN_OR_RETURN(const std::string device, ResolveDevice(requested));
  if (device == "cpu") {
    return std::unique_ptr<Backend>(new CpuBackend(CpuBackendThreads(options), options.precision));
  }
#if KILN_WITH_CUDA
  KILN_ASSIGN_OR_RETURN(int index, ParseDevice(device));
  CudaBackendOptions cuda;
  cuda.allow_tf32 = options.precision == Precision::kTf32;
  cuda.bf16 = options.precision == Precision::kBf16;
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend, CudaBackend::Create(index, cuda));
  return std::unique_ptr<Backend>(std::move(backend));
#else
  // ValidateDevice has already answered NotFound for every cuda:N in a build without CUDA.
  return absl::InternalError(absl::StrCat("device ", device, " has no backend in this build"));
#endif
}

int64_t ConvWorkspaceBytes(DeviceKind device, const Conv2dGeometry& g, int threads, ConvPass pass,
                           Precision precision) {
  // cuDNN algorithms are picked to fit the backend's fixed limit; under bf16 the convolution's
  // bfloat16 copies come on top.
  if (device == DeviceKind::kCuda) {
    const int64_t copies = precision == Precision::kBf16
                               ? CudaBf16ConvLayout(g, pass == ConvPass::kBackward).bytes
                               : 0;
    return static_cast<int64_t>(CudaBackendOptions{}.conv_workspace_limit) + copies;
  }
  return CpuBackend::ConvWorkspaceBytes(g, threads, /*backward=*/pass == ConvPass::kBackward,
                                        precision);
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    Backend* backend, KeyValueStore* store, int rank, int world_size,
    const CommunicatorOptions& options) {
  if (backend->kind() == DeviceKind::kCuda) {
#if defined(KILN_WITH_NCCL)
    NcclOptions nccl;
    nccl.timeout = options.timeout;
    nccl.on_stuck_abort = options.on_stuck_abort;
    // CudaBackend is the one backend of kind kCuda.
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> comm,
                          NcclCommunicator::Create(store, rank, world_size,
                                                   static_cast<CudaBackend*>(backend), nccl));
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

std::vector<std::string> AvailableDevices() {
  std::vector<std::string> out = {"cpu"};
  for (int i = 0, n = DeviceCount(nullptr); i < n; ++i) out.push_back(absl::StrCat("cuda:", i));
  return out;
}

std::string NoCudaDeviceReason() {
  std::string why;
  return DeviceCount(&why) > 0 ? std::string() : why;
}

ScopedThreadBinding::ScopedThreadBinding() : saved_threads_(omp_get_max_threads()) {}

ScopedThreadBinding::~ScopedThreadBinding() { omp_set_num_threads(saved_threads_); }

}  // namespace kiln
