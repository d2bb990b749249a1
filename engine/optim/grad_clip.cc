#include "engine/optim/grad_clip.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kiln {

namespace {

// torch's clip_grad_norm_ adds this to the norm before dividing.
constexpr float kNormEpsilon = 1e-6f;

// The sum of squares of one parameter's gradient, read back (the failure path only).
absl::StatusOr<float> GradSumOfSquares(Backend* backend, const Parameter& p, Tensor* scratch) {
  KILN_RETURN_IF_ERROR(backend->Fill(scratch, 0.0f));
  KILN_RETURN_IF_ERROR(backend->SumOfSquares(p.grad.numel(), p.grad.f32(), scratch->f32()));
  float sum = 0;
  KILN_RETURN_IF_ERROR(backend->CopyToHost(*scratch, &sum, sizeof(sum)));
  return sum;
}

// Why the norm is not finite: the first parameter whose gradient is not, or an overflow.
absl::Status NonFiniteNorm(Backend* backend, const std::vector<NamedParameter>& params, float total,
                           Tensor* scratch) {
  for (const NamedParameter& p : params) {
    KILN_ASSIGN_OR_RETURN(float sum, GradSumOfSquares(backend, *p.param, scratch));
    if (!std::isfinite(sum)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "gradient clipping: the gradients' global norm is ", total, "; parameter ", p.name,
          std::isnan(sum) ? "'s gradient holds NaN" : "'s gradient is infinite or too large"));
    }
  }
  return absl::FailedPreconditionError(
      absl::StrCat("gradient clipping: the gradients' global norm is ", total,
                   " (every gradient is finite, but their sum of squares overflows float)"));
}

}  // namespace

absl::StatusOr<float> ClipGradNorm(Backend* backend, const std::vector<NamedParameter>& params,
                                   float max_norm, Tensor* scratch) {
  if (!(max_norm > 0.0f) || !std::isfinite(max_norm)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient clipping: max_norm must be finite and > 0, got ", max_norm));
  }
  if (scratch == nullptr || scratch->empty() || scratch->dtype() != DType::kF32 ||
      scratch->numel() < 1) {
    return absl::InvalidArgumentError("gradient clipping needs a float scratch tensor");
  }
  // One device scalar accumulates every gradient's squares; the host reads it once.
  KILN_RETURN_IF_ERROR(backend->Fill(scratch, 0.0f));
  for (const NamedParameter& p : params) {
    KILN_RETURN_IF_ERROR(
        backend->SumOfSquares(p.param->grad.numel(), p.param->grad.f32(), scratch->f32()));
  }
  float sum = 0;
  KILN_RETURN_IF_ERROR(backend->CopyToHost(*scratch, &sum, sizeof(sum)));
  const float total = std::sqrt(sum);
  if (!std::isfinite(total)) return NonFiniteNorm(backend, params, total, scratch);
  // torch: clip_coef = max_norm / (total_norm + 1e-6) in float32, applied when below 1.
  const float coef = max_norm / (total + kNormEpsilon);
  if (coef < 1.0f) {
    for (const NamedParameter& p : params) {
      KILN_RETURN_IF_ERROR(backend->Scale(p.param->grad.numel(), coef, p.param->grad.f32()));
    }
  }
  return total;
}

}  // namespace kiln
