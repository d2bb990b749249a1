// A job's matrix arithmetic: float32 throughout, TF32 tensor cores for GEMMs and convolutions
// where the device has them, or bfloat16 GEMMs. The engine's form of JobSpec.precision.
#pragma once

#include <optional>
#include <string_view>

namespace kiln {

// kTf32 changes only what a CUDA backend's cuBLAS GEMMs and cuDNN convolutions may use (inputs
// rounded to a 10-bit mantissa, float32 accumulation); weights, activations and optimizer state
// stay float32. A CPU has no TF32 units, so there kTf32 computes exactly as kFp32.
//
// kBf16 is torch.autocast's rule for GEMMs (Linear layers, attention's batched products): their
// inputs are rounded to bfloat16 (round to nearest even) and the products accumulate in float32
// into float32 outputs. Everything else stays float32: convolutions (for now), softmax, losses,
// normalisation, reductions, the optimizer and its state, and the weights, which the optimizer
// updates in float32 (the bfloat16 copies are made from them at each use), so checkpoints hold
// float32 weights as before.
enum class Precision { kFp32, kTf32, kBf16 };

// "fp32", "tf32" or "bf16", as the CLI and the docs spell them.
constexpr std::string_view PrecisionName(Precision p) {
  return p == Precision::kTf32 ? "tf32" : p == Precision::kBf16 ? "bf16" : "fp32";
}

// The words PrecisionNamed accepts, as an error message lists them.
inline constexpr std::string_view kPrecisionNames = "fp32, tf32 or bf16";

// The precision PrecisionName spells `name` (exactly, lower-case), or nullopt for any other word.
// The one parser of these words (a serving load's "precision" parameter).
constexpr std::optional<Precision> PrecisionNamed(std::string_view name) {
  for (Precision p : {Precision::kFp32, Precision::kTf32, Precision::kBf16}) {
    if (PrecisionName(p) == name) return p;
  }
  return std::nullopt;
}

}  // namespace kiln
