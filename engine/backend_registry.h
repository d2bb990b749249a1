// Picks the backend for a device string: "auto", "cpu" or "cuda:N".
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend.h"

namespace kiln {

struct BackendOptions {
  int threads = 0;  // CPU threads for GEMM and loops; 0 = all cores
};

// "auto" takes cuda:0 when a CUDA device is present and the CPU otherwise, and says which on
// stderr; "cuda:N" without such a device is NotFound naming the devices found. CUDA backends
// keep TF32 off unless the environment sets KILN_CUDA_ALLOW_TF32=1. A CUDA backend that cannot
// start (driver or library failure) is an error, never a silent fall back to the CPU. Never
// aborts for lack of a driver.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(std::string_view device,
                                                       const BackendOptions& options = {});

// Checks a device string without creating anything: InvalidArgument for a malformed one,
// NotFound for a device this machine lacks.
absl::Status ValidateDevice(std::string_view device);

// "cpu" plus "cuda:0".. for every CUDA device found.
std::vector<std::string> AvailableDevices();

}  // namespace kiln
