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

// "auto" takes the CPU until the CUDA backend exists (then: cuda:0 when present); "cuda:N"
// without such a device is NotFound naming the devices found, and with one, Unimplemented for
// now. Never aborts for lack of a driver.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(std::string_view device,
                                                       const BackendOptions& options = {});

// Checks a device string without creating anything: InvalidArgument for a malformed one,
// NotFound for a device this machine lacks.
absl::Status ValidateDevice(std::string_view device);

// "cpu" plus "cuda:0".. for every CUDA device found.
std::vector<std::string> AvailableDevices();

}  // namespace kiln
