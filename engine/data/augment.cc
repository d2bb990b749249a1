#include "engine/data/augment.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/rng.h"

namespace kiln {

namespace {

// Keeps the augmentation stream apart from the initialisation, shuffling and dropout streams of
// the same seed.
constexpr uint64_t kAugmentStream = 0xA06D'C409'F11B'5EEDull;

// Which of a sample's draws a hash is for.
enum Draw : uint64_t { kDrawDy = 0, kDrawDx = 1, kDrawFlip = 2 };

// Uniform in [0, n) from the high 32 bits of a 64-bit hash (Lemire's multiply-shift; the bias is
// below 2^-25 for the n used here).
int32_t Below(uint64_t hash, uint32_t n) { return static_cast<int32_t>(((hash >> 32) * n) >> 32); }

}  // namespace

absl::StatusOr<AugmentGeometry> AugmentImageGeometry(const AugmentConfig& config,
                                                     const Shape& sample_shape, bool float_features,
                                                     int norm_channels) {
  if (float_features) {
    return absl::InvalidArgumentError(
        "random crop and horizontal flip need images, but the dataset holds float feature rows (a "
        "table)");
  }
  if (sample_shape.size() != 2 && sample_shape.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "random crop and horizontal flip need images of [H, W] or [C, H, W], but the dataset's "
        "samples are [",
        absl::StrJoin(sample_shape, ", "), "]"));
  }
  AugmentGeometry g;
  const size_t h = sample_shape.size() - 2;
  g.channels = sample_shape.size() == 3 ? static_cast<int>(sample_shape[0]) : 1;
  g.height = static_cast<int>(sample_shape[h]);
  g.width = static_cast<int>(sample_shape[h + 1]);
  g.padding = config.random_crop_padding;
  const int limit = std::min({g.height / 2, g.width / 2, kMaxCropPadding});
  if (g.padding < 0 || g.padding > limit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "random_crop_padding must be in [0, ", limit, "] for ", g.height, "x", g.width,
        " images (at most half the shorter side and ", kMaxCropPadding, "), got ", g.padding));
  }
  if (norm_channels != 1 && norm_channels != g.channels) {
    return absl::InvalidArgumentError(
        absl::StrCat("the normalisation has ", norm_channels, " channels but the images have ",
                     g.channels, "; crop and flip need one, or one per image channel"));
  }
  return g;
}

CropFlip DrawCropFlip(const AugmentConfig& config, uint64_t seed, int epoch, int64_t step,
                      int64_t sample) {
  const uint64_t key =
      SplitMix64(SplitMix64(SplitMix64(seed ^ kAugmentStream) ^ static_cast<uint64_t>(epoch)) ^
                 static_cast<uint64_t>(step));
  auto hash = [&](Draw d) {
    return SplitMix64(key ^ SplitMix64(static_cast<uint64_t>(sample) * 3 + d));
  };
  CropFlip c;
  const auto span = static_cast<uint32_t>(2 * std::max(config.random_crop_padding, 0) + 1);
  if (span > 1) {
    c.dy = Below(hash(kDrawDy), span);
    c.dx = Below(hash(kDrawDx), span);
  }
  if (config.horizontal_flip) c.flip = static_cast<int32_t>(hash(kDrawFlip) >> 63);
  return c;
}

}  // namespace kiln
