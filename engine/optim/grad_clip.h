// Gradient clipping by the global norm, as torch.nn.utils.clip_grad_norm_(params, max_norm).
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/model/model.h"

namespace kiln {

// total = sqrt(sum over params of sum(grad^2)); when max_norm / (total + 1e-6) < 1 every gradient
// is multiplied by it, else the gradients are left bit for bit. Returns total, the norm before
// clipping. A tensor listed once is counted once (Model::parameters() lists a tied weight once,
// as torch's parameters() does). scratch: a float tensor of at least one element on `backend`,
// the device scalar the norm is summed in (its contents are overwritten); one float is read back.
// InvalidArgument for max_norm <= 0 or not finite; FailedPrecondition, naming the first
// parameter whose gradient is not finite, when the norm is NaN or infinite.
absl::StatusOr<float> ClipGradNorm(Backend* backend, const std::vector<NamedParameter>& params,
                                   float max_norm, Tensor* scratch);

}  // namespace kiln
