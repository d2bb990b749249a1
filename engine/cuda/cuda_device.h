// CUDA device discovery, safe to call on machines without a GPU or a driver.
#pragma once

#include <string>

namespace kiln {

// Number of usable CUDA devices; 0 (with the driver's reason in *why, when given) when there is
// no driver or no device.
int CudaDeviceCount(std::string* why = nullptr);

// "NVIDIA H200, 139 GiB, sm_90" for device `index`, or the error text.
std::string CudaDeviceDescription(int index);

}  // namespace kiln
