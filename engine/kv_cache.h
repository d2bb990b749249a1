// One causal attention layer's keys and values for the positions of one sequence run so far
// (incremental decoding, Model::ForwardAt), with the layer's working buffers for that sequence,
// so that sequences decoded side by side share no mutable state in the layer.
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace kiln {

struct KvCache {
  // (n_head, capacity, head_dim) each, capacity the model's sequence length T; positions
  // 0..length-1 hold values. Empty until the layer's first ForwardAt allocates them.
  Tensor k, v;
  int64_t length = 0;
  // Scratch for up to capacity new positions: c_attn's output (t, 3C), its (3, t, C) transpose,
  // q, k, v per head (3, H, t, hd), the weights (H, t, length), the heads (H, t, hd) and merged
  // back (t, C).
  Tensor qkv, transposed, split, weights, heads, merged;
};

}  // namespace kiln
