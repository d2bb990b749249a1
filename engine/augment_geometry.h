// The shapes of crop-and-flip augmentation as a backend applies it while gathering a batch
// (Backend::GatherAugmentNormalize): the images' geometry and each sample's drawn crop and flip.
#pragma once

#include <cstdint>

namespace kiln {

// Crop-and-flip augmentation of uint8 images as a batch is gathered (GatherAugmentNormalize):
// samples are channels x height x width (CHW), cropped from the image padded by `padding` zeros
// on each side.
struct AugmentGeometry {
  int channels = 1, height = 0, width = 0, padding = 0;
  int64_t sample_elems() const { return int64_t{channels} * height * width; }
};
// One sample's augmentation: the crop window's top-left corner in the padded image (dy, dx in
// [0, 2 padding]; dy = dx = padding is the image unmoved), and whether the crop is then mirrored
// left to right (flip != 0). Drawn on the host (engine/data/augment.h), read by the op from device
// memory.
struct CropFlip {
  int32_t dy = 0, dx = 0, flip = 0;
  // Written out, not defaulted: nvcc compiles the CUDA backend's .cu files as C++17.
  bool operator==(const CropFlip& o) const { return dy == o.dy && dx == o.dx && flip == o.flip; }
};
static_assert(sizeof(CropFlip) == 3 * sizeof(int32_t), "CropFlip is three int32s on every device");

}  // namespace kiln
