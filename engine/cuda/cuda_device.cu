#include <cuda_runtime.h>
#include <dlfcn.h>

#include <string>

#include "engine/cuda/cuda_device.h"

namespace kiln {

int CudaDeviceCount(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why != nullptr) {
      *why = cudaGetErrorString(err);
      // The runtime says "insufficient driver" also when there is no driver at all.
      if (err == cudaErrorInsufficientDriver) {
        void* driver = dlopen("libcuda.so.1", RTLD_LAZY);
        if (driver == nullptr) {
          *why = "no NVIDIA driver (libcuda.so.1 cannot be loaded)";
        } else {
          dlclose(driver);
          *why += " (the NVIDIA driver is older than this build's CUDA runtime)";
        }
      }
    }
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return 0;
  }
  if (count == 0 && why != nullptr) *why = "no CUDA device";
  return count;
}

std::string CudaDeviceDescription(int index) {
  cudaDeviceProp prop;
  const cudaError_t err = cudaGetDeviceProperties(&prop, index);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  return std::string(prop.name) + ", " + std::to_string(prop.totalGlobalMem >> 30) + " GiB, sm_" +
         std::to_string(prop.major) + std::to_string(prop.minor);
}

}  // namespace kiln
