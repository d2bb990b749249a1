#include "client/image_folder.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli_status.h"
#include "client/image_decode.h"
#include "client/image_resize.h"
#include "common/byte_size.h"
#include "common/status_macros.h"

namespace kiln::client {
namespace {

namespace fs = std::filesystem;

// No picture file is near this; a bigger one is a mistake, not something to read into memory.
constexpr int64_t kMaxImageFileBytes = int64_t{256} << 20;
// kilnd takes labels 0..65535.
constexpr size_t kMaxClasses = 65536;

bool IsImageName(const fs::path& path) {
  const std::string ext = absl::AsciiStrToLower(path.extension().string());
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

bool IsHidden(const fs::path& path) { return path.filename().string().starts_with("."); }

// A folder's entries, sorted by name; errors name the folder.
absl::StatusOr<std::vector<fs::directory_entry>> Entries(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return UsageError(
        absl::StrCat(dir, fs::exists(dir, ec) ? ": not a folder" : ": no such folder"));
  }
  std::vector<fs::directory_entry> entries;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    entries.push_back(*it);
  }
  if (ec) return UsageError(absl::StrCat(dir, ": cannot list it: ", ec.message()));
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.path().filename() < b.path().filename(); });
  return entries;
}

// A split's files before decoding: per class, its images in name order.
struct SplitListing {
  std::vector<std::string> classes;
  std::vector<std::vector<std::string>> files;
  int64_t count = 0;
  int64_t ignored = 0;
  std::string ignored_example;
};

void Ignore(SplitListing* listing, const fs::path& path) {
  if (listing->ignored++ == 0) listing->ignored_example = path.string();
}

// The class folders of `dir` (sorted, hidden ones skipped) and the images in each.
absl::StatusOr<SplitListing> ListSplit(const std::string& dir) {
  KILN_ASSIGN_OR_RETURN(std::vector<fs::directory_entry> entries, Entries(dir));
  SplitListing listing;
  int64_t loose_images = 0;
  std::error_code ec;
  for (const fs::directory_entry& e : entries) {
    if (e.is_directory(ec) && !IsHidden(e.path())) {
      listing.classes.push_back(e.path().filename().string());
    } else {
      loose_images += e.is_regular_file(ec) && IsImageName(e.path());
      Ignore(&listing, e.path());
    }
  }
  if (listing.classes.empty()) {
    return UsageError(
        absl::StrCat(dir, ": no class folders; a dataset folder holds one sub-folder per class (",
                     dir, "/cat/1.png, ", dir, "/dog/2.jpg)",
                     loose_images > 0 ? absl::StrCat(", but this one holds ", loose_images,
                                                     " images itself: is it one class's folder?")
                                      : ""));
  }
  if (listing.classes.size() > kMaxClasses) {
    return UsageError(
        absl::StrCat(dir, ": ", listing.classes.size(), " class folders; at most ", kMaxClasses));
  }
  for (const std::string& cls : listing.classes) {
    const std::string class_dir = absl::StrCat(dir, "/", cls);
    KILN_ASSIGN_OR_RETURN(std::vector<fs::directory_entry> files, Entries(class_dir));
    std::vector<std::string>& images = listing.files.emplace_back();
    for (const fs::directory_entry& f : files) {
      if (f.is_regular_file(ec) && IsImageName(f.path()) && !IsHidden(f.path())) {
        images.push_back(f.path().string());
      } else {
        Ignore(&listing, f.path());
      }
    }
    if (images.empty()) {
      return UsageError(absl::StrCat(class_dir, ": no ", kImageExtensions,
                                     " images; every class folder needs at least one"));
    }
    listing.count += static_cast<int64_t>(images.size());
  }
  return listing;
}

// "a, b, c" of the names in `names` missing from `other`, at most 10 of them.
std::string Missing(const std::vector<std::string>& names, const std::vector<std::string>& other) {
  std::vector<std::string> missing;
  for (const std::string& n : names) {
    if (!std::binary_search(other.begin(), other.end(), n)) missing.push_back(n);
  }
  if (missing.size() > 10) {
    const size_t more = missing.size() - 10;
    missing.resize(10);
    missing.push_back(absl::StrCat("and ", more, " more"));
  }
  return missing.empty() ? "none" : absl::StrJoin(missing, ", ");
}

absl::StatusOr<std::string> ReadImageBytes(const std::string& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) return UsageError(absl::StrCat("cannot read ", path, ": ", ec.message()));
  if (static_cast<int64_t>(size) > kMaxImageFileBytes) {
    return UsageError(absl::StrCat(path, ": ", FormatBytes(static_cast<int64_t>(size)),
                                   " is larger than any picture kiln reads (",
                                   FormatBytes(kMaxImageFileBytes), ")"));
  }
  std::ifstream in(path, std::ios::binary);
  std::string bytes(size, '\0');
  if (!in.read(bytes.data(), static_cast<std::streamsize>(size))) {
    return UsageError(absl::StrCat("cannot read ", path));
  }
  return bytes;
}

// Decodes every listed image, brought to one size; the shape is decided as it goes.
class FolderDecoder {
 public:
  FolderDecoder(const ImageFolderOptions& options, int64_t total)
      : options_(options), total_(total) {
    height_ = options.resize_height;
    width_ = options.resize_width;
  }

  absl::StatusOr<std::vector<Image>> Decode(const SplitListing& listing) {
    std::vector<Image> images;
    images.reserve(static_cast<size_t>(listing.count));
    for (const std::vector<std::string>& files : listing.files) {
      for (const std::string& path : files) {
        KILN_ASSIGN_OR_RETURN(std::string bytes, ReadImageBytes(path));
        KILN_ASSIGN_OR_RETURN(
            Image image,
            DecodeImage(bytes, path,
                        options_.grayscale ? ChannelMode::kGray : ChannelMode::kAsStored));
        KILN_RETURN_IF_ERROR(Fit(path, &image));
        images.push_back(std::move(image));
      }
    }
    return images;
  }

  int channels() const { return channels_; }
  int height() const { return height_; }
  int width() const { return width_; }

 private:
  // Brings `image` to the dataset's size, or refuses it; checks the whole fits the limit as soon
  // as the sample size is known, and again when a colour image makes it three times larger.
  absl::Status Fit(const std::string& path, Image* image) {
    const bool first = first_path_.empty();
    if (first) first_path_ = path;
    if (first && height_ == 0) {
      height_ = image->height;
      width_ = image->width;
    }
    const bool resize = options_.resize_height > 0;
    if (image->height != height_ || image->width != width_) {
      if (!resize) {
        return UsageError(absl::StrCat(path, " is ", image->height, "x", image->width,
                                       " (HxW) but the first image, ", first_path_, ", is ",
                                       height_, "x", width_,
                                       "; give --resize HxW to bring them all to one size"));
      }
      *image = ResizeImage(*image, height_, width_);
    }
    if (first || image->channels > channels_) {
      channels_ = std::max(channels_, image->channels);
      const int64_t sample = int64_t{channels_} * height_ * width_;
      if (total_ * sample > options_.max_bytes) {
        return UsageError(absl::StrCat(
            total_, " images of ", channels_ == 3 ? "3x" : "", height_, "x", width_, " are ",
            FormatBytes(total_ * sample), " as arrays, more than kiln upload sends (",
            FormatBytes(options_.max_bytes), "); make them smaller with --resize HxW",
            channels_ == 3 ? " or --grayscale" : "", ", or upload fewer"));
      }
    }
    return absl::OkStatus();
  }

  const ImageFolderOptions& options_;
  const int64_t total_;
  std::string first_path_;
  int height_ = 0;
  int width_ = 0;
  int channels_ = 1;
};

// The split's samples, each as `channels` planes, one after another; frees the images as it goes.
ImageSplit Assemble(const std::string& dir, const SplitListing& listing, std::vector<Image> images,
                    int channels) {
  ImageSplit split;
  split.dir = dir;
  split.count = listing.count;
  split.ignored = listing.ignored;
  split.ignored_example = listing.ignored_example;
  size_t i = 0;
  for (size_t label = 0; label < listing.files.size(); ++label) {
    for (size_t k = 0; k < listing.files[label].size(); ++k, ++i) {
      Image image = WithChannels(std::move(images[i]), channels);
      if (split.samples.empty()) split.samples.reserve(images.size() * image.pixels.size());
      split.samples.append(image.pixels.begin(), image.pixels.end());
      split.labels.push_back(static_cast<int32_t>(label));
    }
  }
  return split;
}

}  // namespace

std::vector<int64_t> ImageFolders::sample_shape() const {
  if (channels == 3) return {3, height, width};
  return {height, width};
}

absl::StatusOr<ImageFolders> ReadImageFolders(const std::string& train_dir,
                                              const std::string& test_dir,
                                              const ImageFolderOptions& options) {
  KILN_ASSIGN_OR_RETURN(SplitListing train, ListSplit(train_dir));
  SplitListing test;
  const bool has_test = !test_dir.empty();
  if (has_test) {
    KILN_ASSIGN_OR_RETURN(test, ListSplit(test_dir));
    if (test.classes != train.classes) {
      return UsageError(absl::StrCat("--test ", test_dir, " and --train ", train_dir,
                                     " must hold the same class folders; only in ", test_dir, ": ",
                                     Missing(test.classes, train.classes), "; only in ", train_dir,
                                     ": ", Missing(train.classes, test.classes)));
    }
  }
  FolderDecoder decoder(options, train.count + test.count);
  KILN_ASSIGN_OR_RETURN(std::vector<Image> train_images, decoder.Decode(train));
  std::vector<Image> test_images;
  if (has_test) {
    KILN_ASSIGN_OR_RETURN(test_images, decoder.Decode(test));
  }
  // One colour image makes a colour dataset: gray ones are repeated into three planes.
  ImageFolders out;
  out.classes = train.classes;
  out.channels = decoder.channels();
  out.height = decoder.height();
  out.width = decoder.width();
  out.has_test = has_test;
  out.train = Assemble(train_dir, train, std::move(train_images), out.channels);
  if (has_test) out.test = Assemble(test_dir, test, std::move(test_images), out.channels);
  return out;
}

}  // namespace kiln::client
