#include "client/image_decode.h"

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/cli_status.h"

#ifdef KILN_CLIENT_HAVE_PNG
#include <png.h>
#endif
#ifdef KILN_CLIENT_HAVE_JPEG
#include <jpeglib.h>
#endif

namespace kiln::client {
namespace {

// Interleaved samples (HWC), `stride` a pixel, of which the first `channels` are kept, as planes.
void ToPlanes(const uint8_t* interleaved, int stride, Image* out) {
  const size_t plane = static_cast<size_t>(out->width) * static_cast<size_t>(out->height);
  out->pixels.resize(plane * static_cast<size_t>(out->channels));
  for (size_t c = 0; c < static_cast<size_t>(out->channels); ++c) {
    uint8_t* dst = out->pixels.data() + c * plane;
    for (size_t i = 0; i < plane; ++i) dst[i] = interleaved[i * stride + c];
  }
}

#ifdef KILN_CLIENT_HAVE_PNG
absl::StatusOr<Image> DecodePng(std::string_view bytes, const std::string& source) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size())) {
    return UsageError(absl::StrCat(source, ": not a readable PNG: ", image.message));
  }
  // The header alone gives the size: refuse before the decoder allocates for it.
  if (absl::Status size = CheckImageSize(source, image.width, image.height); !size.ok()) {
    png_image_free(&image);
    return size;
  }
  // Read as stored, in 8 bits; alpha is read and then dropped, since without a background libpng
  // would composite it onto black. 16-bit samples are sRGB-coded, as PIL and numpy see them, not
  // linear light (libpng's default), so they scale to 8 bits without a gamma curve.
  const bool colour = (image.format & PNG_FORMAT_FLAG_COLOR) != 0;
  const bool alpha = (image.format & PNG_FORMAT_FLAG_ALPHA) != 0;
  image.format = (colour ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY) | (alpha ? PNG_FORMAT_FLAG_ALPHA : 0);
  image.flags |= PNG_IMAGE_FLAG_16BIT_sRGB;
  std::vector<uint8_t> interleaved(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, interleaved.data(), 0, nullptr)) {
    std::string message = image.message;
    png_image_free(&image);
    return UsageError(absl::StrCat(source, ": corrupt or truncated PNG: ", message));
  }
  Image out;
  out.width = static_cast<int>(image.width);
  out.height = static_cast<int>(image.height);
  out.channels = colour ? 3 : 1;
  ToPlanes(interleaved.data(), out.channels + (alpha ? 1 : 0), &out);
  return out;
}
#endif

#ifdef KILN_CLIENT_HAVE_JPEG
// libjpeg reports errors through error_exit, which by default prints and ends the process: ours
// jumps back to the decoder with the message instead.
struct JpegErrors {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = {};
};

[[noreturn]] void JpegErrorExit(j_common_ptr cinfo) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

// Warnings (level -1) are what libjpeg says about corrupt or missing data it papers over with
// gray: a truncated file is one. A dataset must not learn from those, so they are errors too.
void JpegEmitMessage(j_common_ptr cinfo, int level) {
  if (level < 0) JpegErrorExit(cinfo);
}

// Decodes into `out` (as stored: gray or RGB). Kept apart from DecodeJpeg so that no local of the
// function that calls setjmp changes between setjmp and longjmp. Returns false with
// errors->message set on failure.
bool DecodeJpegInto(std::string_view bytes, const std::string& source, JpegErrors* errors,
                    std::vector<uint8_t>* interleaved, Image* out, absl::Status* refused) {
  jpeg_decompress_struct cinfo;
  std::memset(&cinfo, 0, sizeof(cinfo));  // a create that fails leaves nothing to destroy
  cinfo.err = jpeg_std_error(&errors->manager);
  errors->manager.error_exit = JpegErrorExit;
  errors->manager.emit_message = JpegEmitMessage;
  if (setjmp(errors->jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  *refused = CheckImageSize(source, cinfo.image_width, cinfo.image_height);
  if (refused->ok() && (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK)) {
    *refused = UsageError(absl::StrCat(source, ": a CMYK JPEG; convert it to RGB first"));
  }
  if (!refused->ok()) {
    jpeg_destroy_decompress(&cinfo);
    return true;
  }
  cinfo.out_color_space = cinfo.num_components == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  out->width = static_cast<int>(cinfo.output_width);
  out->height = static_cast<int>(cinfo.output_height);
  out->channels = cinfo.output_components;
  const size_t row = static_cast<size_t>(out->width) * static_cast<size_t>(out->channels);
  interleaved->resize(row * static_cast<size_t>(out->height));
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW line = interleaved->data() + cinfo.output_scanline * row;
    jpeg_read_scanlines(&cinfo, &line, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

absl::StatusOr<Image> DecodeJpeg(std::string_view bytes, const std::string& source) {
  JpegErrors errors;
  std::vector<uint8_t> interleaved;
  Image out;
  absl::Status refused;
  if (!DecodeJpegInto(bytes, source, &errors, &interleaved, &out, &refused)) {
    return UsageError(absl::StrCat(source, ": corrupt or truncated JPEG: ", errors.message));
  }
  if (!refused.ok()) return refused;
  ToPlanes(interleaved.data(), out.channels, &out);
  return out;
}
#endif

}  // namespace

absl::Status CheckImageSize(const std::string& source, int64_t width, int64_t height) {
  if (width > 0 && height > 0 && width <= kMaxImageSide && height <= kMaxImageSide &&
      width * height <= kMaxImagePixels) {
    return absl::OkStatus();
  }
  return UsageError(absl::StrCat(source, ": ", width, "x", height, " pixels is larger than ",
                                 kMaxImageSide, " a side or ", kMaxImagePixels, " in all"));
}

ImageFormat DetectImageFormat(std::string_view bytes) {
  if (bytes.size() >= 8 && bytes.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0) return ImageFormat::kPng;
  // Every JPEG starts with the start-of-image marker and then another marker.
  if (bytes.size() >= 3 && bytes.compare(0, 3, "\xff\xd8\xff") == 0) return ImageFormat::kJpeg;
  return ImageFormat::kOther;
}

absl::StatusOr<Image> DecodeImage(std::string_view bytes, const std::string& source,
                                  ChannelMode mode) {
  absl::StatusOr<Image> image;
  switch (DetectImageFormat(bytes)) {
    case ImageFormat::kPng:
#ifdef KILN_CLIENT_HAVE_PNG
      image = DecodePng(bytes, source);
#else
      return UsageError(absl::StrCat(source, ": a PNG, but this kiln was built without libpng"));
#endif
      break;
    case ImageFormat::kJpeg:
#ifdef KILN_CLIENT_HAVE_JPEG
      image = DecodeJpeg(bytes, source);
#else
      return UsageError(absl::StrCat(source, ": a JPEG, but this kiln was built without libjpeg"));
#endif
      break;
    case ImageFormat::kOther:
      return UsageError(absl::StrCat(source, ": not a PNG or JPEG image"));
  }
  if (!image.ok() || mode == ChannelMode::kAsStored) return image;
  return WithChannels(*std::move(image), mode == ChannelMode::kGray ? 1 : 3);
}

Image WithChannels(Image image, int channels) {
  if (image.channels == channels) return image;
  const size_t plane = static_cast<size_t>(image.width) * static_cast<size_t>(image.height);
  std::vector<uint8_t> out(plane * static_cast<size_t>(channels));
  if (channels == 3) {
    for (size_t c = 0; c < 3; ++c) std::memcpy(out.data() + c * plane, image.pixels.data(), plane);
  } else {
    // ITU-R 601 luma in integers, as PIL's convert("L"): (299 R + 587 G + 114 B) / 1000, rounded.
    const uint8_t* r = image.pixels.data();
    const uint8_t* g = r + plane;
    const uint8_t* b = g + plane;
    for (size_t i = 0; i < plane; ++i) {
      out[i] = static_cast<uint8_t>((299 * r[i] + 587 * g[i] + 114 * b[i] + 500) / 1000);
    }
  }
  image.pixels = std::move(out);
  image.channels = channels;
  return image;
}

}  // namespace kiln::client
