#include "test_images.h"

#include <cstdio>
#include <cstring>

#ifdef KILN_CLIENT_HAVE_JPEG
#include <jpeglib.h>
#endif
#ifdef KILN_CLIENT_HAVE_PNG
#include <png.h>
#endif

namespace kiln::client::testing {

#ifdef KILN_CLIENT_HAVE_PNG
namespace {

uint32_t PngFormat(int channels) {
  switch (channels) {
    case 1:
      return PNG_FORMAT_GRAY;
    case 2:
      return PNG_FORMAT_GA;
    case 3:
      return PNG_FORMAT_RGB;
    default:
      return PNG_FORMAT_RGBA;
  }
}

}  // namespace

bool WritePng(const std::string& path, int width, int height, int channels,
              const std::string& pixels) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<uint32_t>(width);
  image.height = static_cast<uint32_t>(height);
  image.format = PngFormat(channels);
  return png_image_write_to_file(&image, path.c_str(), 0, pixels.data(), 0, nullptr) != 0;
}

bool WritePng16(const std::string& path, int width, int height, int channels,
                const std::string& pixels) {
  // The simplified API writes 16-bit data only as linear light; the classic one writes samples
  // as given, which is what a 16-bit PNG from a scanner or a camera holds.
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return false;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    std::fclose(file);
    return false;
  }
  png_init_io(png, file);
  const int type = channels == 1   ? PNG_COLOR_TYPE_GRAY
                   : channels == 2 ? PNG_COLOR_TYPE_GRAY_ALPHA
                   : channels == 3 ? PNG_COLOR_TYPE_RGB
                                   : PNG_COLOR_TYPE_RGBA;
  png_set_IHDR(png, info, static_cast<uint32_t>(width), static_cast<uint32_t>(height), 16, type,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  const size_t row = static_cast<size_t>(width) * static_cast<size_t>(channels) * 2;
  for (int y = 0; y < height; ++y) {
    png_write_row(png, reinterpret_cast<png_const_bytep>(pixels.data() + y * row));
  }
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return std::fclose(file) == 0;
}

#endif

#ifdef KILN_CLIENT_HAVE_JPEG
bool WriteJpeg(const std::string& path, int width, int height, int channels,
               const std::string& pixels) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return false;
  jpeg_compress_struct cinfo;
  jpeg_error_mgr errors;
  cinfo.err = jpeg_std_error(&errors);  // a test: libjpeg's exit on error is acceptable here
  jpeg_create_compress(&cinfo);
  jpeg_stdio_dest(&cinfo, file);
  cinfo.image_width = static_cast<JDIMENSION>(width);
  cinfo.image_height = static_cast<JDIMENSION>(height);
  cinfo.input_components = channels;
  cinfo.in_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 95, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  const size_t row = static_cast<size_t>(width) * static_cast<size_t>(channels);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW line =
        reinterpret_cast<JSAMPROW>(const_cast<char*>(pixels.data() + cinfo.next_scanline * row));
    jpeg_write_scanlines(&cinfo, &line, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  return std::fclose(file) == 0;
}

#endif

std::string Flat(int width, int height, int channels, uint8_t value) {
  return std::string(static_cast<size_t>(width) * height * channels, static_cast<char>(value));
}

}  // namespace kiln::client::testing
