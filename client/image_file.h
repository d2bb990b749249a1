// Images for predict: PNG and JPEG (when built with libpng and libjpeg; client/image_decode.h),
// binary or ASCII PGM, single images out of IDX image files and CIFAR-10 batches; grayscale, or
// colour as channel planes (CHW).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/image_decode.h"

namespace kiln::client {

// What a file holds, judged by its first bytes.
enum class ImageFileKind { kPng, kJpeg, kPgm, kIdxImages, kUnknown };
ImageFileKind DetectImageFile(const std::string& bytes);

// Decodes a PNG, JPEG or PGM file into `channels` planes (1: colour is converted to gray; 3: RGB,
// a gray image repeated in each plane); 16-bit images are reduced to 8 bits, alpha dropped.
absl::StatusOr<Image> ReadImageFile(const std::string& path, int channels = 1);
// Image `index` (0-based) of a CIFAR-10 batch file (3x32x32, CHW as stored).
absl::StatusOr<Image> ReadCifar10Image(const std::string& path, int64_t index);
// Image `index` (0-based) of an IDX3 ubyte file such as t10k-images-idx3-ubyte.
absl::StatusOr<Image> ReadIdxImage(const std::string& path, int64_t index);

// Parses PGM bytes ("P5" binary or "P2" ASCII, maxval up to 65535, scaled to 0..255).
absl::StatusOr<Image> DecodePgm(const std::string& bytes, const std::string& source);

}  // namespace kiln::client
