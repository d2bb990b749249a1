// Training-time augmentation of image batches, as torchvision's RandomCrop(size, padding=P) and
// RandomHorizontalFlip(): the configuration, the image geometry it needs, and the per-sample
// decisions. The decisions are a pure function of (seed, epoch, step, sample) drawn on the host,
// so a resumed run draws exactly what the uninterrupted one did and no RNG state is checkpointed;
// the backend applies them where the batch is gathered (Backend::GatherAugmentNormalize).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/tensor.h"

namespace kiln {

// Crop paddings beyond this are refused whatever the image: more than any recipe uses, and it
// keeps a hostile spec's offsets small.
inline constexpr int kMaxCropPadding = 64;

struct AugmentConfig {
  // Pad each side by P zero pixels, then crop back to HxW at an offset uniform in [0, 2P] on each
  // axis (torchvision's RandomCrop(size, padding=P)); 0 is off.
  int random_crop_padding = 0;
  // Mirror left to right with probability 0.5, after the crop (RandomHorizontalFlip()).
  bool horizontal_flip = false;

  bool enabled() const { return random_crop_padding > 0 || horizontal_flip; }
};

// The geometry `config` augments samples of `sample_shape` with: [H, W] (one channel) or
// [C, H, W]. InvalidArgument naming the problem for float features (a table), samples of another
// rank, normalisation channels other than 1 or C, or a padding outside [0, min(H, W) / 2] (or
// above kMaxCropPadding).
absl::StatusOr<AugmentGeometry> AugmentImageGeometry(const AugmentConfig& config,
                                                     const Shape& sample_shape, bool float_features,
                                                     int norm_channels);

// The decision for sample `sample` (0-based, in the batch) of 0-based step `step` of 1-based
// epoch `epoch`: dy, dx uniform in [0, 2 * random_crop_padding] and flip with probability 0.5
// when horizontal_flip, each from its own counter-based hash of (seed, epoch, step, sample).
CropFlip DrawCropFlip(const AugmentConfig& config, uint64_t seed, int epoch, int64_t step,
                      int64_t sample);

}  // namespace kiln
