#include "client/image_resize.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace kiln::client {
namespace {

// One source pixel's share of an output pixel.
struct Tap {
  int index;
  float weight;
};

// For each of `out` output pixels along one side, the source pixels of the `in` that make it.
std::vector<std::vector<Tap>> SideTaps(int in, int out) {
  std::vector<std::vector<Tap>> taps(static_cast<size_t>(out));
  const double scale = static_cast<double>(in) / out;
  for (int i = 0; i < out; ++i) {
    std::vector<Tap>& t = taps[static_cast<size_t>(i)];
    if (out <= in) {
      // Output i covers source [i scale, (i + 1) scale); each pixel weighs by its overlap.
      const double start = i * scale, end = (i + 1) * scale;
      for (int j = static_cast<int>(start); j < in && j < end; ++j) {
        const double overlap = std::min<double>(end, j + 1) - std::max<double>(start, j);
        if (overlap > 0) t.push_back({j, static_cast<float>(overlap / scale)});
      }
    } else {
      // The output pixel's centre, in source coordinates, between two source centres.
      const double x = std::clamp((i + 0.5) * scale - 0.5, 0.0, in - 1.0);
      const int j = static_cast<int>(x);
      const float f = static_cast<float>(x - j);
      t.push_back({j, 1 - f});
      if (f > 0) t.push_back({j + 1, f});
    }
  }
  return taps;
}

}  // namespace

Image ResizeImage(const Image& image, int height, int width) {
  if (image.height == height && image.width == width) return image;
  const auto across = SideTaps(image.width, width);
  const auto down = SideTaps(image.height, height);
  Image out;
  out.width = width;
  out.height = height;
  out.channels = image.channels;
  out.pixels.resize(static_cast<size_t>(width) * height * image.channels);
  // Rows first into floats (in_h x width a channel), then columns, rounding once at the end.
  std::vector<float> rows(static_cast<size_t>(image.height) * width);
  for (int c = 0; c < image.channels; ++c) {
    const uint8_t* src = image.pixels.data() + static_cast<size_t>(c) * image.width * image.height;
    for (int y = 0; y < image.height; ++y) {
      const uint8_t* line = src + static_cast<size_t>(y) * image.width;
      for (int x = 0; x < width; ++x) {
        float sum = 0;
        for (const Tap& t : across[static_cast<size_t>(x)]) {
          sum += t.weight * static_cast<float>(line[t.index]);
        }
        rows[static_cast<size_t>(y) * width + x] = sum;
      }
    }
    uint8_t* dst = out.pixels.data() + static_cast<size_t>(c) * width * height;
    for (int y = 0; y < height; ++y) {
      for (int x = 0; x < width; ++x) {
        float sum = 0;
        for (const Tap& t : down[static_cast<size_t>(y)]) {
          sum += t.weight * rows[static_cast<size_t>(t.index) * width + x];
        }
        dst[static_cast<size_t>(y) * width + x] =
            static_cast<uint8_t>(std::clamp(std::lround(sum), 0L, 255L));
      }
    }
  }
  return out;
}

}  // namespace kiln::client
