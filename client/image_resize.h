// Resampling an image to another size for kiln upload --format folder --resize and kiln predict
// --resize: per side, area averaging when it shrinks and bilinear interpolation when it grows.
#pragma once

#include "client/image_decode.h"

namespace kiln::client {

// `image` as height x width, each channel plane on its own. A side that shrinks averages the
// source pixels each output pixel covers, weighted by the share covered (OpenCV's INTER_AREA);
// a side that grows interpolates linearly between the two nearest source pixels, with pixel
// centres at half-integers and the edges clamped (PyTorch's align_corners=False). Results are
// rounded to the nearest integer. height and width are positive.
Image ResizeImage(const Image& image, int height, int width);

}  // namespace kiln::client
