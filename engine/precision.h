// A job's matrix arithmetic: float32 throughout, or TF32 tensor cores for GEMMs and convolutions
// where the device has them. The engine's form of JobSpec.precision.
#pragma once

#include <string_view>

namespace kiln {

// kTf32 changes only what a CUDA backend's cuBLAS GEMMs and cuDNN convolutions may use (inputs
// rounded to a 10-bit mantissa, float32 accumulation); weights, activations and optimizer state
// stay float32. A CPU has no TF32 units, so there kTf32 computes exactly as kFp32.
enum class Precision { kFp32, kTf32 };

// "fp32" or "tf32", as the CLI and the docs spell them.
constexpr std::string_view PrecisionName(Precision p) {
  return p == Precision::kTf32 ? "tf32" : "fp32";
}

}  // namespace kiln
