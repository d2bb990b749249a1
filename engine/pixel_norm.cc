#include "engine/pixel_norm.h"

#include "absl/strings/str_cat.h"

namespace kiln {

absl::StatusOr<FoldedNorm> FoldPixelNorm(const PixelNorm& n, int64_t sample_elems,
                                         float input_scale) {
  const int c = n.channels();
  if (n.channel_mean.size() != n.channel_std.size() || c > kMaxNormChannels || sample_elems < 0 ||
      (sample_elems > 0 && sample_elems % c != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("normalisation: ", n.channel_mean.size(), " channel means and ",
                     n.channel_std.size(), " channel stds do not fit samples of ", sample_elems,
                     " values (at most ", kMaxNormChannels, " channels, dividing the sample)"));
  }
  FoldedNorm f;
  f.plane = sample_elems / c;
  for (int i = 0; i < c; ++i) {
    const float mean = n.channel_mean.empty() ? n.mean : n.channel_mean[i];
    const float std = n.channel_std.empty() ? n.std : n.channel_std[i];
    f.a.push_back(n.scale * input_scale / std);
    f.b.push_back(-mean / std);
  }
  return f;
}

}  // namespace kiln
