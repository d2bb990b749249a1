// Grayscale images for predict: PNG (when built with libpng), binary or ASCII PGM, and single
// images out of IDX image files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln::client {

// 8-bit grayscale pixels, row-major.
struct GrayImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;
};

// What a file holds, judged by its first bytes.
enum class ImageFileKind { kPng, kPgm, kIdxImages, kUnknown };
ImageFileKind DetectImageFile(const std::string& bytes);

// Decodes a PNG or PGM file (colour PNGs are converted to gray, 16-bit ones reduced to 8).
absl::StatusOr<GrayImage> ReadImageFile(const std::string& path);
// Image `index` (0-based) of an IDX3 ubyte file such as t10k-images-idx3-ubyte.
absl::StatusOr<GrayImage> ReadIdxImage(const std::string& path, int64_t index);

// Parses PGM bytes ("P5" binary or "P2" ASCII, maxval up to 65535, scaled to 0..255).
absl::StatusOr<GrayImage> DecodePgm(const std::string& bytes, const std::string& source);

}  // namespace kiln::client
