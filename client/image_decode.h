// PNG (libpng) and JPEG (libjpeg-turbo) files decoded into 8-bit channel planes: what kiln predict
// and kiln upload --format folder read pictures with.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kiln::client {

// 8-bit pixels, row-major, one plane per channel (CHW): 1 channel (gray) or 3 (R, G, B).
struct Image {
  int width = 0;
  int height = 0;
  int channels = 1;
  std::vector<uint8_t> pixels;
};

// Larger than any model input kilnd accepts (1,000,000 values a sample); a header that claims
// more is refused before anything is allocated for it.
inline constexpr int64_t kMaxImageSide = 16384;
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 24;
// A usage error naming `source` when width x height passes those bounds.
absl::Status CheckImageSize(const std::string& source, int64_t width, int64_t height);

// What bytes hold, by their first bytes (the file name's extension is not trusted).
enum class ImageFormat { kPng, kJpeg, kOther };
ImageFormat DetectImageFormat(std::string_view bytes);

// The channels a decoded image gets: as stored (gray and gray + alpha give 1, colour and palettes
// 3), or converted to gray (ITU-R 601 luma, PIL's convert("L")) or to RGB (gray repeated).
enum class ChannelMode { kAsStored, kGray, kRgb };

// Decodes PNG or JPEG bytes. Alpha is dropped (not composited), 16-bit samples are scaled to 8
// bits, palettes expanded. Errors are usage errors that begin with `source`: bytes that are
// neither format, a corrupt or truncated file (libjpeg's warnings count as errors), a CMYK JPEG,
// an image larger than kMaxImageSide or kMaxImagePixels, or a build without the library.
absl::StatusOr<Image> DecodeImage(std::string_view bytes, const std::string& source,
                                  ChannelMode mode);

// `image` with `channels` 1 or 3, by the same conversions as DecodeImage's modes.
Image WithChannels(Image image, int channels);

}  // namespace kiln::client
