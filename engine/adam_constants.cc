#include "engine/adam_constants.h"

#include <cmath>

#include "engine/backend.h"

namespace kiln {

AdamConstants FoldAdamHyper(const AdamHyper& h) {
  const double t = static_cast<double>(h.step);
  const float bias1 = static_cast<float>(1.0 - std::pow(static_cast<double>(h.beta1), t));
  const float bias2_sqrt =
      static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(h.beta2), t)));
  const bool decoupled = h.decay == WeightDecayMode::kDecoupled;
  AdamConstants c;
  c.step_size = h.lr / bias1;
  c.beta1 = h.beta1;
  c.beta2 = h.beta2;
  c.eps = h.eps;
  c.bias2_sqrt = bias2_sqrt;
  c.param_scale = decoupled ? 1.0f - h.lr * h.weight_decay : 1.0f;
  c.grad_decay = decoupled ? 0.0f : h.weight_decay;
  return c;
}

}  // namespace kiln
