// The input normalisation of a model: how raw uint8 pixels (or float features) become the floats
// it reads, as a whole (PixelNorm) and folded into one multiply-add per value (FoldedNorm), the
// form every backend applies.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln {

// Normalisation of raw uint8 pixels: x = (u8 * scale - mean) / std; or per channel, when
// channel_mean and channel_std hold C values each (1..kMaxNormChannels), x = (u8 * scale -
// channel_mean[c]) / channel_std[c] with c = j / (sample_elems / C) for sample element j (CHW).
inline constexpr int kMaxNormChannels = 256;
// What a model's inputs are: uint8 pixels (FP32 serving inputs then mean pixel / 255), or float
// features (CSV tables; scale 1, per-feature channels, FP32 inputs taken as they are).
enum class NormInput { kPixels, kFeatures };
struct PixelNorm {
  PixelNorm() = default;
  // The scalar form, as {scale, mean, std}.
  PixelNorm(float scale_, float mean_, float std_) : scale(scale_), mean(mean_), std(std_) {}

  float scale = 1.0f / 255.0f, mean = 0.0f, std = 1.0f;
  std::vector<float> channel_mean, channel_std;  // both empty: the scalar mean and std apply
  NormInput input = NormInput::kPixels;

  int channels() const { return channel_mean.empty() ? 1 : static_cast<int>(channel_mean.size()); }
};

// A PixelNorm folded for samples of `sample_elems`: x = u8 * a[c] + b[c] over planes of `plane`
// elements (one per channel), with the raw value first multiplied by `input_scale`. What every
// backend applies; InvalidArgument when the channels do not divide the sample or are malformed.
struct FoldedNorm {
  int64_t plane = 0;
  std::vector<float> a, b;
};
absl::StatusOr<FoldedNorm> FoldPixelNorm(const PixelNorm& n, int64_t sample_elems,
                                         float input_scale = 1.0f);

}  // namespace kiln
