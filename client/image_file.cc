#include "client/image_file.h"

#include <cctype>
#include <cstring>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli_status.h"
#include "common/idx_header.h"
#include "common/status_macros.h"

namespace kiln::client {
namespace {

absl::StatusOr<std::string> Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return UsageError(absl::StrCat("cannot read ", path));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

uint32_t BigEndian32(const std::string& b, size_t at) {
  return (uint32_t{static_cast<uint8_t>(b[at])} << 24) |
         (uint32_t{static_cast<uint8_t>(b[at + 1])} << 16) |
         (uint32_t{static_cast<uint8_t>(b[at + 2])} << 8) |
         uint32_t{static_cast<uint8_t>(b[at + 3])};
}

}  // namespace

ImageFileKind DetectImageFile(const std::string& bytes) {
  switch (DetectImageFormat(bytes)) {
    case ImageFormat::kPng:
      return ImageFileKind::kPng;
    case ImageFormat::kJpeg:
      return ImageFileKind::kJpeg;
    case ImageFormat::kOther:
      break;
  }
  if (bytes.size() >= 2 && bytes[0] == 'P' && (bytes[1] == '5' || bytes[1] == '2')) {
    return ImageFileKind::kPgm;
  }
  if (bytes.size() >= 16 && BigEndian32(bytes, 0) == 0x00000803) return ImageFileKind::kIdxImages;
  return ImageFileKind::kUnknown;
}

absl::StatusOr<Image> DecodePgm(const std::string& bytes, const std::string& source) {
  size_t at = 2;
  // Header fields are separated by whitespace; '#' starts a comment to the end of the line.
  auto next_number = [&](long* value) {
    for (;;) {
      while (at < bytes.size() && std::isspace(static_cast<unsigned char>(bytes[at]))) ++at;
      if (at < bytes.size() && bytes[at] == '#') {
        while (at < bytes.size() && bytes[at] != '\n') ++at;
        continue;
      }
      break;
    }
    const size_t start = at;
    while (at < bytes.size() && std::isdigit(static_cast<unsigned char>(bytes[at]))) ++at;
    if (at == start || at - start > 9) return false;
    *value = std::stol(bytes.substr(start, at - start));
    return true;
  };
  long width = 0, height = 0, maxval = 0;
  if (bytes.size() < 2 || bytes[0] != 'P' || (bytes[1] != '5' && bytes[1] != '2') ||
      !next_number(&width) || !next_number(&height) || !next_number(&maxval) || width <= 0 ||
      height <= 0 || maxval <= 0 || maxval > 65535) {
    return UsageError(absl::StrCat(source, ": not a valid PGM header"));
  }
  if (absl::Status size = CheckImageSize(source, width, height); !size.ok()) {
    return size;
  }
  Image out;
  out.width = static_cast<int>(width);
  out.height = static_cast<int>(height);
  const size_t count = static_cast<size_t>(width) * static_cast<size_t>(height);
  out.pixels.resize(count);
  auto scale = [maxval](long v) { return static_cast<uint8_t>((v * 255 + maxval / 2) / maxval); };
  if (bytes[1] == '5') {
    ++at;  // the single whitespace after maxval
    const size_t per = maxval > 255 ? 2 : 1;
    if (bytes.size() < at + count * per) {
      return UsageError(absl::StrCat(source, ": PGM data is cut short"));
    }
    for (size_t i = 0; i < count; ++i) {
      long v = static_cast<uint8_t>(bytes[at + i * per]);
      if (per == 2) v = (v << 8) | static_cast<uint8_t>(bytes[at + i * per + 1]);
      out.pixels[i] = scale(std::min(v, maxval));
    }
  } else {
    for (size_t i = 0; i < count; ++i) {
      long v = 0;
      if (!next_number(&v)) return UsageError(absl::StrCat(source, ": PGM data is cut short"));
      out.pixels[i] = scale(std::min(v, maxval));
    }
  }
  return out;
}

absl::StatusOr<Image> ReadImageFile(const std::string& path, int channels) {
  absl::StatusOr<std::string> bytes = Slurp(path);
  if (!bytes.ok()) return bytes.status();
  switch (DetectImageFile(*bytes)) {
    case ImageFileKind::kPgm: {
      KILN_ASSIGN_OR_RETURN(Image gray, DecodePgm(*bytes, path));
      return WithChannels(std::move(gray), channels == 3 ? 3 : 1);
    }
    case ImageFileKind::kPng:
    case ImageFileKind::kJpeg:
      return DecodeImage(*bytes, path, channels == 3 ? ChannelMode::kRgb : ChannelMode::kGray);
    case ImageFileKind::kIdxImages:
      return UsageError(absl::StrCat(path, " is an IDX file; pick an image with --index N"));
    case ImageFileKind::kUnknown:
      break;
  }
  return UsageError(absl::StrCat(path, ": not a PNG, JPEG or PGM image"));
}

absl::StatusOr<Image> ReadIdxImage(const std::string& path, int64_t index) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return UsageError(absl::StrCat("cannot read ", path));
  std::string header(16, '\0');
  if (!in.read(header.data(), 16) || DetectImageFile(header) != ImageFileKind::kIdxImages) {
    return UsageError(absl::StrCat(path, ": not an IDX ubyte image file (magic 0x00000803)"));
  }
  absl::StatusOr<IdxHeader> parsed = ParseIdxHeader(header, path, "file");
  if (!parsed.ok()) return UsageError(std::string(parsed.status().message()));
  const int64_t count = parsed->dims[0];
  if (index < 0 || index >= count) {
    return UsageError(absl::StrCat("--index ", index, ": ", path, " holds images 0..", count - 1));
  }
  Image out;
  KILN_RETURN_IF_ERROR(CheckImageSize(path, parsed->dims[2], parsed->dims[1]));
  out.height = static_cast<int>(parsed->dims[1]);
  out.width = static_cast<int>(parsed->dims[2]);
  const size_t size = static_cast<size_t>(out.width) * static_cast<size_t>(out.height);
  out.pixels.resize(size);
  in.seekg(static_cast<std::streamoff>(16 + index * static_cast<int64_t>(size)));
  if (!in.read(reinterpret_cast<char*>(out.pixels.data()), static_cast<std::streamsize>(size))) {
    return UsageError(absl::StrCat(path, ": cut short before image ", index));
  }
  return out;
}

absl::StatusOr<Image> ReadCifar10Image(const std::string& path, int64_t index) {
  constexpr int64_t kRecord = 1 + 3 * 32 * 32;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return UsageError(absl::StrCat("cannot read ", path));
  const int64_t size = static_cast<int64_t>(in.tellg());
  if (size <= 0 || size % kRecord != 0) {
    return UsageError(absl::StrCat(path, ": not a CIFAR-10 batch (", size,
                                   " bytes is not a whole number of ", kRecord, "-byte records)"));
  }
  if (index < 0 || index >= size / kRecord) {
    return UsageError(
        absl::StrCat("--index ", index, ": ", path, " holds images 0..", size / kRecord - 1));
  }
  Image out;
  out.width = out.height = 32;
  out.channels = 3;
  out.pixels.resize(3 * 32 * 32);
  in.seekg(static_cast<std::streamoff>(index * kRecord + 1));
  if (!in.read(reinterpret_cast<char*>(out.pixels.data()),
               static_cast<std::streamsize>(out.pixels.size()))) {
    return UsageError(absl::StrCat(path, ": cut short before image ", index));
  }
  return out;
}

}  // namespace kiln::client
