// PNG and JPEG decoding into channel planes (client/image_decode.h) and resizing
// (client/image_resize.h), on files written by libpng and libjpeg.
#include "client/image_decode.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "cli_test_support.h"
#include "client/image_resize.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_images.h"
#include "tests/support/status_matchers.h"

namespace kiln::client {
namespace {

using ::testing::AllOf;
using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class ImageDecodeTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("kiln-decode"); }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  absl::StatusOr<Image> Decode(const std::string& name, ChannelMode mode = ChannelMode::kAsStored) {
    return DecodeImage(testing::ReadFile(Path(name)), Path(name), mode);
  }
  std::string dir_;
};

#ifdef KILN_CLIENT_HAVE_PNG
TEST_F(ImageDecodeTest, PngKeepsGrayAsOneChannelAndColourAsThreePlanes) {
  ASSERT_TRUE(testing::WritePng(Path("g.png"), 3, 2, 1, std::string("\x01\x02\x03\x04\x05\x06")));
  auto gray = Decode("g.png");
  ASSERT_OK(gray);
  EXPECT_EQ(gray->channels, 1);
  EXPECT_EQ(gray->width, 3);
  EXPECT_EQ(gray->height, 2);
  EXPECT_THAT(gray->pixels, ElementsAre(1, 2, 3, 4, 5, 6));

  // Two RGB pixels, interleaved in the file, come back as R, G and B planes.
  ASSERT_TRUE(testing::WritePng(Path("c.png"), 2, 1, 3, std::string("\x0a\x14\x1e\x28\x32\x3c")));
  auto colour = Decode("c.png");
  ASSERT_OK(colour);
  EXPECT_EQ(colour->channels, 3);
  EXPECT_THAT(colour->pixels, ElementsAre(10, 40, 20, 50, 30, 60));
}

TEST_F(ImageDecodeTest, PngAlphaIsDroppedNotComposited) {
  // A transparent pixel keeps its colour: alpha is dropped, as PIL's convert("RGB") does.
  ASSERT_TRUE(testing::WritePng(Path("a.png"), 1, 1, 4, std::string("\xc8\x64\x32\x00", 4)));
  auto rgba = Decode("a.png");
  ASSERT_OK(rgba);
  EXPECT_EQ(rgba->channels, 3);
  EXPECT_THAT(rgba->pixels, ElementsAre(200, 100, 50));
  ASSERT_TRUE(testing::WritePng(Path("ga.png"), 1, 1, 2, std::string("\x7b\x00", 2)));
  auto ga = Decode("ga.png");
  ASSERT_OK(ga);
  EXPECT_EQ(ga->channels, 1);
  EXPECT_THAT(ga->pixels, ElementsAre(123));
}

TEST_F(ImageDecodeTest, SixteenBitPngIsScaledToEightBits) {
  // 0xabcd / 65535 * 255 = 171.1; 0xffff is white.
  ASSERT_TRUE(testing::WritePng16(Path("16.png"), 2, 1, 1, std::string("\xab\xcd\xff\xff")));
  auto image = Decode("16.png");
  ASSERT_OK(image);
  EXPECT_THAT(image->pixels, ElementsAre(171, 255));
}

TEST_F(ImageDecodeTest, ChannelModesConvertGrayAndColour) {
  ASSERT_TRUE(testing::WritePng(Path("g.png"), 2, 1, 1, std::string("\x10\x20")));
  auto rgb = Decode("g.png", ChannelMode::kRgb);
  ASSERT_OK(rgb);
  EXPECT_EQ(rgb->channels, 3);
  EXPECT_THAT(rgb->pixels, ElementsAre(16, 32, 16, 32, 16, 32));
  // ITU-R 601 luma: 0.299 R + 0.587 G + 0.114 B.
  ASSERT_TRUE(testing::WritePng(Path("c.png"), 1, 1, 3, std::string("\xc8\x64\x32")));
  auto gray = Decode("c.png", ChannelMode::kGray);
  ASSERT_OK(gray);
  EXPECT_EQ(gray->channels, 1);
  EXPECT_THAT(gray->pixels, ElementsAre(124));  // 59.8 + 58.7 + 5.7
}

TEST_F(ImageDecodeTest, ATruncatedPngIsAnErrorNamingTheFile) {
  ASSERT_TRUE(testing::WritePng(Path("whole.png"), 16, 16, 3, std::string(768, '\x55')));
  const std::string bytes = testing::ReadFile(Path("whole.png"));
  testing::WriteFile(Path("cut.png"), bytes.substr(0, bytes.size() / 2));
  auto cut = Decode("cut.png");
  ASSERT_FALSE(cut.ok());
  EXPECT_THAT(std::string(cut.status().message()), HasSubstr(Path("cut.png") + ": "));
  testing::WriteFile(Path("header.png"), bytes.substr(0, 20));
  auto header = Decode("header.png");
  ASSERT_FALSE(header.ok());
  EXPECT_THAT(std::string(header.status().message()), HasSubstr(Path("header.png") + ": "));
}
#endif

#ifdef KILN_CLIENT_HAVE_JPEG
TEST_F(ImageDecodeTest, JpegDecodesGrayAndColour) {
  ASSERT_TRUE(testing::WriteJpeg(Path("g.jpg"), 8, 8, 1, testing::Flat(8, 8, 1, 90)));
  auto gray = Decode("g.jpg");
  ASSERT_OK(gray);
  EXPECT_EQ(gray->channels, 1);
  EXPECT_EQ(gray->pixels.size(), 64u);
  for (uint8_t p : gray->pixels) EXPECT_NEAR(p, 90, 2);

  std::string rgb;
  for (int i = 0; i < 16 * 8; ++i) rgb += std::string("\xc8\x32\x0a", 3);
  ASSERT_TRUE(testing::WriteJpeg(Path("c.jpeg"), 16, 8, 3, rgb));
  auto colour = Decode("c.jpeg");
  ASSERT_OK(colour);
  EXPECT_EQ(colour->channels, 3);
  EXPECT_EQ(colour->width, 16);
  EXPECT_EQ(colour->height, 8);
  ASSERT_EQ(colour->pixels.size(), 3u * 128);
  for (int i = 0; i < 128; ++i) {
    EXPECT_NEAR(colour->pixels[i], 200, 4);
    EXPECT_NEAR(colour->pixels[128 + i], 50, 4);
    EXPECT_NEAR(colour->pixels[256 + i], 10, 4);
  }
}

// libjpeg's default error handler exits the process; these must come back as errors instead.
TEST_F(ImageDecodeTest, ACorruptOrTruncatedJpegIsAnErrorNamingTheFile) {
  ASSERT_TRUE(testing::WriteJpeg(Path("whole.jpg"), 32, 32, 3, std::string(3072, '\x40')));
  const std::string bytes = testing::ReadFile(Path("whole.jpg"));
  testing::WriteFile(Path("cut.jpg"), bytes.substr(0, bytes.size() / 2));
  auto cut = Decode("cut.jpg");
  ASSERT_FALSE(cut.ok());
  EXPECT_THAT(std::string(cut.status().message()), HasSubstr(Path("cut.jpg") + ": "));

  // The start-of-image marker, then noise.
  std::string noise = bytes.substr(0, 2);
  for (int i = 0; i < 200; ++i) noise.push_back(static_cast<char>(i * 37 + 11));
  testing::WriteFile(Path("noise.jpg"), noise);
  auto corrupt = Decode("noise.jpg");
  ASSERT_FALSE(corrupt.ok());
  EXPECT_THAT(std::string(corrupt.status().message()), HasSubstr(Path("noise.jpg") + ": "));
}
#endif

#if defined(KILN_CLIENT_HAVE_PNG) && defined(KILN_CLIENT_HAVE_JPEG)
// Every cut and many corruptions of a PNG and a JPEG: a cut is an error naming the file, a
// corruption decodes to a whole image or is such an error; none ends the process (libjpeg's
// default).
TEST_F(ImageDecodeTest, EveryTruncationAndManyCorruptionsAreImagesOrErrorsNamingTheFile) {
  std::string pixels;
  for (int i = 0; i < 12 * 10 * 3; ++i) pixels.push_back(static_cast<char>(i * 7));
  ASSERT_TRUE(testing::WritePng(Path("p.png"), 12, 10, 3, pixels));
  ASSERT_TRUE(testing::WriteJpeg(Path("j.jpg"), 12, 10, 3, pixels));
  std::mt19937 rng(19);
  for (const std::string name : {"p.png", "j.jpg"}) {
    const std::string whole = testing::ReadFile(Path(name));
    // A PNG without its 12-byte IEND chunk still holds every pixel, and libpng does not read on.
    const size_t whole_pixels = absl::EndsWith(name, ".png") ? whole.size() - 12 : whole.size();
    for (size_t n = 0; n < whole_pixels; ++n) {
      auto cut = DecodeImage(whole.substr(0, n), name, ChannelMode::kAsStored);
      ASSERT_FALSE(cut.ok()) << name << " cut to " << n << " bytes";
      EXPECT_THAT(std::string(cut.status().message()), ::testing::StartsWith(name + ": "));
    }
    for (int i = 0; i < 1000; ++i) {
      std::string bytes = whole;
      for (int k = 0; k < 1 + i % 4; ++k) bytes[rng() % bytes.size()] = static_cast<char>(rng());
      auto image = DecodeImage(bytes, name, ChannelMode::kAsStored);
      if (image.ok()) {
        EXPECT_EQ(image->pixels.size(),
                  static_cast<size_t>(image->width) * image->height * image->channels);
      } else {
        EXPECT_THAT(std::string(image.status().message()), ::testing::StartsWith(name + ": "));
      }
    }
  }
}
#endif

TEST_F(ImageDecodeTest, BytesThatAreNeitherPngNorJpegAreRefused) {
  testing::WriteFile(Path("x.png"), "GIF89a and so on");
  auto other = Decode("x.png");
  ASSERT_FALSE(other.ok());
  EXPECT_THAT(std::string(other.status().message()),
              AllOf(HasSubstr(Path("x.png")), HasSubstr("not a PNG or JPEG")));
}

Image Gray(int width, int height, std::vector<uint8_t> pixels) {
  Image image;
  image.width = width;
  image.height = height;
  image.pixels = std::move(pixels);
  return image;
}

TEST(ImageResizeTest, TheSameSizeIsACopy) {
  const Image in = Gray(3, 1, {7, 8, 9});
  EXPECT_THAT(ResizeImage(in, 1, 3).pixels, ElementsAre(7, 8, 9));
}

TEST(ImageResizeTest, ShrinkingAveragesTheAreaEachOutputPixelCovers) {
  // 4x4 to 2x2: each output is the mean of a 2x2 block.
  const Image in = Gray(4, 4, {0, 2, 10, 10, 4, 6, 10, 10, 100, 100, 1, 1, 100, 100, 1, 3});
  EXPECT_THAT(ResizeImage(in, 2, 2).pixels, ElementsAre(3, 10, 100, 2));
  // 3 to 2: output 0 covers source [0, 1.5), output 1 covers [1.5, 3).
  EXPECT_THAT(ResizeImage(Gray(3, 1, {0, 30, 60}), 1, 2).pixels, ElementsAre(10, 50));
}

TEST(ImageResizeTest, GrowingIsBilinearWithHalfPixelCentresAndClampedEdges) {
  EXPECT_THAT(ResizeImage(Gray(2, 1, {0, 100}), 1, 4).pixels, ElementsAre(0, 25, 75, 100));
  EXPECT_THAT(ResizeImage(Gray(1, 2, {0, 100}), 4, 1).pixels, ElementsAre(0, 25, 75, 100));
}

TEST(ImageResizeTest, ColourPlanesAreResizedEachOnItsOwn) {
  Image in = Gray(2, 2, {1, 1, 1, 1, 50, 50, 50, 50, 200, 200, 200, 200});
  in.channels = 3;
  const Image out = ResizeImage(in, 3, 5);
  EXPECT_EQ(out.channels, 3);
  EXPECT_EQ(out.width, 5);
  EXPECT_EQ(out.height, 3);
  ASSERT_EQ(out.pixels.size(), 45u);
  EXPECT_THAT(std::vector<uint8_t>(out.pixels.begin(), out.pixels.begin() + 15), Each(1));
  EXPECT_THAT(std::vector<uint8_t>(out.pixels.begin() + 30, out.pixels.end()), Each(200));
}

}  // namespace
}  // namespace kiln::client
