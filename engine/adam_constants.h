// The constants of one Adam/AdamW step, folded on the host from AdamHyper (engine/backend.h) in
// one place for every backend, so that the CPU's loop and the CUDA kernel run the same float
// arithmetic on the same float constants.
#pragma once

namespace kiln {

struct AdamHyper;

// Per element, PyTorch's formulas: p = param * param_scale; g = grad + grad_decay * p;
// m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
// param = p - step_size * m / (sqrt(v) / bias2_sqrt + eps).
struct AdamConstants {
  float step_size, beta1, beta2, eps, bias2_sqrt, param_scale, grad_decay;
};

// Bias corrections for step h.step (in double, then rounded), and the weight decay as Adam (added
// to the gradient) or AdamW (decoupled: the parameter scaled) applies it.
AdamConstants FoldAdamHyper(const AdamHyper& h);

}  // namespace kiln
