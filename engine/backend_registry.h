// Picks the backend for a device string: "auto", "cpu" or "cuda:N".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend.h"

namespace kiln {

struct BackendOptions {
  int threads = 0;  // CPU threads for GEMM and loops; 0 = the backend's share of the cores
  // How many backends share the device side by side (jobs on one CPU): with threads = 0 a CPU
  // backend takes 1/shares of the cores, so their thread teams never oversubscribe them.
  int shares = 1;
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
// keep TF32 off unless the environment sets KILN_CUDA_ALLOW_TF32=1. A CUDA backend that cannot
// start (driver or library failure) is an error, never a silent fall back to the CPU. Never
// aborts for lack of a driver.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(std::string_view device,
                                                       const BackendOptions& options = {});

// The device "auto" stands for on this machine (cuda:0 when a CUDA device is present, else
// "cpu"); any other device string is checked (ValidateDevice) and returned as it is. The one
// place "auto" is decided: jobs record the result, CreateBackend builds on it.
absl::StatusOr<std::string> ResolveDevice(std::string_view device);

// The threads CreateBackend gives a CPU backend made with `options` (what the memory plan of a
// job on the CPU counts its per-thread workspace for).
int CpuBackendThreads(const BackendOptions& options);

// Checks a device string without creating anything: InvalidArgument for a malformed one,
// NotFound for a device this machine lacks.
absl::Status ValidateDevice(std::string_view device);

// The pass a convolution's workspace is sized for: a forward alone, or a training step's backward.
enum class ConvPass { kForward, kBackward };

// The workspace, in bytes, that a backend of kind `device` made by CreateBackend holds for
// convolution `g` in `pass`: on the CPU, for `threads` threads (CpuBackend::ConvWorkspaceBytes;
// the largest int64 for a geometry it cannot run); on CUDA, cuDNN's fixed limit whatever the
// shape. What the memory plan counts, without including any backend.
int64_t ConvWorkspaceBytes(DeviceKind device, const Conv2dGeometry& g, int threads, ConvPass pass);

// "cpu" plus "cuda:0".. for every CUDA device found.
std::vector<std::string> AvailableDevices();

}  // namespace kiln
