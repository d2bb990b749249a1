// Image folders as datasets: one sub-folder per class (the classes are the sorted folder names, a
// class's label its index), PNG and JPEG files in each, decoded into one array of samples per
// split for kiln upload --format folder.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln::client {

// Decoded arrays larger than this are refused before decoding (the client holds them in memory;
// kilnd's own --max_upload_bytes is 512 MiB unless raised).
inline constexpr int64_t kMaxImageFolderBytes = int64_t{2} << 30;
// The files a class folder contributes, by extension (any case); others are counted and skipped.
inline constexpr char kImageExtensions[] = ".png, .jpg or .jpeg";

struct ImageFolderOptions {
  int resize_height = 0;  // both 0: every image must have the first one's size
  int resize_width = 0;
  bool grayscale = false;  // colour images become gray; otherwise one colour image makes all RGB
  int64_t max_bytes = kMaxImageFolderBytes;
};

// One split: its samples (N x C x H x W uint8, CHW each, in class order then file-name order)
// and their labels.
struct ImageSplit {
  std::string dir;
  int64_t count = 0;
  std::string samples;
  std::vector<int32_t> labels;
  int64_t ignored = 0;          // files that are not images by extension, and other entries
  std::string ignored_example;  // one of them, to show
};

struct ImageFolders {
  std::vector<std::string> classes;
  int channels = 1;
  int height = 0;
  int width = 0;
  ImageSplit train;
  ImageSplit test;
  bool has_test = false;
  // {H, W} for gray samples (as MNIST's), {3, H, W} for colour ones.
  std::vector<int64_t> sample_shape() const;
};

// Reads `train_dir` and, when `test_dir` is not empty, `test_dir`, which must hold the same class
// folders. Errors are usage errors naming the folder or file and the problem: a folder missing or
// without class folders, an empty class, an image that does not decode, a size that differs from
// the first image's (without a resize), classes that differ between the splits, or more data
// than options.max_bytes.
absl::StatusOr<ImageFolders> ReadImageFolders(const std::string& train_dir,
                                              const std::string& test_dir,
                                              const ImageFolderOptions& options);

}  // namespace kiln::client
