// Picks the backend for a device string ("auto", "cpu" or "cuda:N"), and what goes with a backend:
// the communicator of data-parallel training, the convolution workspace the memory plan counts.
// The one place that knows the concrete backends.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/backend.h"
#include "engine/distributed/communicator.h"
#include "engine/distributed/key_value_store.h"
#include "engine/precision.h"

namespace kiln {

struct BackendOptions {
  int threads = 0;  // CPU threads for GEMM and loops; 0 = the backend's share of the cores
  // How many backends share the device side by side (jobs on one CPU): with threads = 0 a CPU
  // backend takes 1/shares of the cores, so their thread teams never oversubscribe them.
  int shares = 1;
  // kTf32 lets a CUDA backend's GEMMs and convolutions use TF32 tensor cores; a CPU backend has
  // none and computes float32 whatever this says.
  Precision precision = Precision::kFp32;
};

// Restores the calling thread's binding (BindCallingThread) when it goes out of scope: for code
// that creates or runs a backend on a thread that must keep its own setting afterwards.
class ScopedThreadBinding {
 public:
  ScopedThreadBinding();
  ~ScopedThreadBinding();
  ScopedThreadBinding(const ScopedThreadBinding&) = delete;
  ScopedThreadBinding& operator=(const ScopedThreadBinding&) = delete;

 private:
  int saved_threads_;
};

// "auto" takes cuda:0 when a CUDA device is present and the CPU otherwise, and says which on
// stderr; "cuda:N" without such a device is NotFound naming the devices found. CUDA backends
// allow TF32 only when options.precision is kTf32. A CUDA backend that cannot start (driver or
// library failure) is an error, never a silent fall back to the CPU. Never aborts for lack of a
// driver.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(std::string_view device,
                                                       const BackendOptions& options = {});

// The device "auto" stands for on this machine (cuda:0 when a CUDA device is present, else
// "cpu"); any other device string is checked (ValidateDevice) and returned as it is. The one
// place "auto" is decided: jobs record the result, CreateBackend builds on it.
absl::StatusOr<std::string> ResolveDevice(std::string_view device);

// The threads CreateBackend gives a CPU backend made with `options` (what the memory plan of a
// job on the CPU counts its per-thread workspace for): the threads asked for, at most the
// machine's cores, or the cores' share.
int CpuBackendThreads(const BackendOptions& options);

// Checks a device string without creating anything: InvalidArgument for a malformed one,
// NotFound for a device this machine lacks.
absl::Status ValidateDevice(std::string_view device);

// The pass a convolution's workspace is sized for: a forward alone, or a training step's backward.
enum class ConvPass { kForward, kBackward };

// The workspace, in bytes, that a backend of kind `device` made by CreateBackend holds for
// convolution `g` in `pass`: on the CPU, for `threads` threads in `precision`
// (CpuBackend::ConvWorkspaceBytes; the largest int64 for a geometry it cannot run); on CUDA,
// cuDNN's fixed limit whatever the shape. What the memory plan counts, without including any
// backend.
int64_t ConvWorkspaceBytes(DeviceKind device, const Conv2dGeometry& g, int threads, ConvPass pass,
                           Precision precision);

struct CommunicatorOptions {
  // Bounds the rendezvous and every collective: a peer that has not answered by then is taken
  // for dead.
  absl::Duration timeout = absl::Seconds(60);
  // Gloo only (GlooOptions): the address this rank listens on and publishes, a host name or IP,
  // or, when `gloo_interface` is set, that network interface's address ("eth0").
  std::string gloo_hostname = "127.0.0.1";
  std::string gloo_interface;
  // NCCL only (NcclOptions::on_stuck_abort): called when aborting a failed communicator does not
  // return, so that the process can end and free the GPU.
  std::function<void(const std::string&)> on_stuck_abort;
};

// Joins rank `rank` of `world_size` through `store` (used only during the call) with the
// communicator for `backend` (which must outlive it): NCCL on a CUDA backend's device memory and
// stream, Gloo over TCP otherwise. Blocks until every rank has joined or the timeout passes.
// FailedPrecondition for a CUDA backend in a build without NCCL; the communicators' own errors
// otherwise.
absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    Backend* backend, KeyValueStore* store, int rank, int world_size,
    const CommunicatorOptions& options = {});

// "cpu" plus "cuda:0".. for every CUDA device found.
std::vector<std::string> AvailableDevices();

// Why no CUDA device is available ("no NVIDIA driver (...)", "this build of kiln has no CUDA
// support"); empty when there is one. For the caller to report: the engine logs nothing itself.
std::string NoCudaDeviceReason();

}  // namespace kiln
