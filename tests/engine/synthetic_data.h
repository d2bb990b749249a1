// A small learnable image dataset made in memory: class k lights up horizontal band k.
#pragma once

#include <cstdint>

#include "engine/data/dataset.h"
#include "engine/rng.h"

namespace kiln::testing {

inline Dataset BandsDataset(int64_t n, int classes, int side, uint64_t seed) {
  Dataset d;
  d.sample_shape = {side, side};
  d.size = n;
  d.num_classes = classes;
  d.pixels.resize(n * side * side);
  d.labels.resize(n);
  Rng rng(seed);
  const int band = side / classes;
  for (int64_t i = 0; i < n; ++i) {
    const int label = static_cast<int>(rng.Below(classes));
    d.labels[i] = label;
    for (int y = 0; y < side; ++y) {
      for (int x = 0; x < side; ++x) {
        const bool lit = y / band == label;
        const float noise = rng.Uniform(0, 90);
        d.pixels[(i * side + y) * side + x] = static_cast<uint8_t>((lit ? 160 : 0) + noise);
      }
    }
  }
  return d;
}

}  // namespace kiln::testing
