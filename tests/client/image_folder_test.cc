// Image folders as datasets (client/image_folder.h): one sub-folder per class, PNG and JPEG files,
// sizes that agree or are resized, and errors that name the file and the problem.
#include "client/image_folder.h"

#include <filesystem>
#include <string>
#include <vector>

#include "cli_test_support.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "test_images.h"
#include "tests/support/status_matchers.h"

namespace kiln::client {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

#if defined(KILN_CLIENT_HAVE_PNG) && defined(KILN_CLIENT_HAVE_JPEG)

class ImageFolderTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = testing::MakeTempDir("kiln-folder"); }

  // root/split/cls/name as a PNG (or a JPEG when name ends in .jpg) of one value everywhere.
  std::string Put(const std::string& split, const std::string& cls, const std::string& name,
                  int width, int height, int channels, uint8_t value) {
    const std::string dir = root_ + "/" + split + "/" + cls;
    fs::create_directories(dir);
    const std::string path = dir + "/" + name;
    const std::string pixels = testing::Flat(width, height, channels, value);
    const bool ok = name.ends_with(".png")
                        ? testing::WritePng(path, width, height, channels, pixels)
                        : testing::WriteJpeg(path, width, height, channels, pixels);
    EXPECT_TRUE(ok) << path;
    return path;
  }
  std::string Dir(const std::string& split) const { return root_ + "/" + split; }
  std::string Message(const absl::StatusOr<ImageFolders>& r) const {
    return std::string(r.status().message());
  }

  std::string root_;
};

TEST_F(ImageFolderTest, ClassesAreTheSortedSubFoldersAndLabelTheirImages) {
  Put("train", "dog", "1.png", 4, 3, 1, 200);
  Put("train", "cat", "b.jpg", 4, 3, 1, 50);
  Put("train", "cat", "a.png", 4, 3, 1, 10);
  testing::WriteFile(Dir("train") + "/cat/notes.txt", "not an image");
  testing::WriteFile(Dir("train") + "/README", "a file beside the class folders");
  auto folders = ReadImageFolders(Dir("train"), "", {});
  ASSERT_OK(folders);
  EXPECT_THAT(folders->classes, ElementsAre("cat", "dog"));
  EXPECT_EQ(folders->channels, 1);
  EXPECT_THAT(folders->sample_shape(), ElementsAre(3, 4));
  EXPECT_EQ(folders->train.count, 3);
  EXPECT_THAT(folders->train.labels, ElementsAre(0, 0, 1));
  EXPECT_EQ(folders->train.ignored, 2);
  ASSERT_EQ(folders->train.samples.size(), 36u);
  // cat/a.png, cat/b.jpg (JPEG: near 50), dog/1.png, in that order.
  EXPECT_EQ(static_cast<uint8_t>(folders->train.samples[0]), 10);
  EXPECT_NEAR(static_cast<uint8_t>(folders->train.samples[12]), 50, 2);
  EXPECT_EQ(static_cast<uint8_t>(folders->train.samples[24]), 200);
  EXPECT_FALSE(folders->has_test);
}

TEST_F(ImageFolderTest, OneColourImageMakesAColourDatasetAndGrayscaleMakesAGrayOne) {
  Put("train", "a", "gray.png", 2, 2, 1, 30);
  Put("train", "b", "rgba.png", 2, 2, 4, 90);
  Put("test", "a", "x.png", 2, 2, 1, 60);
  Put("test", "b", "y.png", 2, 2, 3, 120);
  auto colour = ReadImageFolders(Dir("train"), Dir("test"), {});
  ASSERT_OK(colour);
  EXPECT_EQ(colour->channels, 3);
  EXPECT_THAT(colour->sample_shape(), ElementsAre(3, 2, 2));
  EXPECT_EQ(colour->train.samples, std::string(12, '\x1e') + std::string(12, '\x5a'));
  EXPECT_EQ(colour->test.count, 2);
  EXPECT_THAT(colour->test.labels, ElementsAre(0, 1));

  ImageFolderOptions gray;
  gray.grayscale = true;
  auto grayscale = ReadImageFolders(Dir("train"), Dir("test"), gray);
  ASSERT_OK(grayscale);
  EXPECT_EQ(grayscale->channels, 1);
  EXPECT_THAT(grayscale->sample_shape(), ElementsAre(2, 2));
  EXPECT_EQ(grayscale->test.samples, std::string(4, '\x3c') + std::string(4, '\x78'));
}

TEST_F(ImageFolderTest, ASizeThatDiffersIsRefusedNamingTheFileAndBothSizesUnlessResized) {
  const std::string first = Put("train", "a", "1.png", 8, 6, 3, 10);
  const std::string odd = Put("train", "b", "2.png", 5, 7, 3, 20);
  auto refused = ReadImageFolders(Dir("train"), "", {});
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(Message(refused), AllOf(HasSubstr(odd), HasSubstr("7x5"), HasSubstr(first),
                                      HasSubstr("6x8"), HasSubstr("--resize")));

  ImageFolderOptions resize;
  resize.resize_height = 4;
  resize.resize_width = 4;
  auto resized = ReadImageFolders(Dir("train"), "", resize);
  ASSERT_OK(resized);
  EXPECT_THAT(resized->sample_shape(), ElementsAre(3, 4, 4));
  EXPECT_EQ(resized->train.samples, std::string(48, '\x0a') + std::string(48, '\x14'));

  // A test image must match the train split's size too.
  Put("test", "a", "t.png", 8, 6, 3, 10);
  const std::string wide = Put("test", "b", "t.png", 9, 6, 3, 10);
  auto test = ReadImageFolders(Dir("train"), Dir("test"), resize);
  ASSERT_OK(test);
  Put("train", "b", "2.png", 8, 6, 3, 20);
  auto unresized = ReadImageFolders(Dir("train"), Dir("test"), {});
  ASSERT_FALSE(unresized.ok());
  EXPECT_THAT(Message(unresized), AllOf(HasSubstr(wide), HasSubstr("6x9")));
}

TEST_F(ImageFolderTest, CorruptImagesAreErrorsNamingTheFile) {
  Put("train", "a", "1.png", 4, 4, 1, 10);
  const std::string png = Put("train", "b", "2.png", 4, 4, 1, 10);
  const std::string bytes = testing::ReadFile(png);
  testing::WriteFile(png, bytes.substr(0, bytes.size() - 20));
  auto cut = ReadImageFolders(Dir("train"), "", {});
  ASSERT_FALSE(cut.ok());
  EXPECT_THAT(Message(cut), HasSubstr(png));

  Put("train", "b", "2.png", 4, 4, 1, 10);
  const std::string jpeg = Put("train", "b", "3.jpg", 4, 4, 1, 10);
  const std::string jpeg_bytes = testing::ReadFile(jpeg);
  testing::WriteFile(jpeg, jpeg_bytes.substr(0, jpeg_bytes.size() / 2));
  auto corrupt = ReadImageFolders(Dir("train"), "", {});
  ASSERT_FALSE(corrupt.ok());
  EXPECT_THAT(Message(corrupt), HasSubstr(jpeg));
}

TEST_F(ImageFolderTest, AnEmptyClassFolderOrNoClassFoldersAreErrors) {
  Put("train", "a", "1.png", 4, 4, 1, 10);
  fs::create_directories(Dir("train") + "/b");
  testing::WriteFile(Dir("train") + "/b/readme.txt", "no images here");
  auto empty = ReadImageFolders(Dir("train"), "", {});
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(Message(empty), AllOf(HasSubstr(Dir("train") + "/b"), HasSubstr("no .png")));

  // Images straight in the folder: the user pointed at a class, not at the dataset.
  Put("flat", ".", "1.png", 4, 4, 1, 10);
  auto flat = ReadImageFolders(Dir("flat"), "", {});
  ASSERT_FALSE(flat.ok());
  EXPECT_THAT(Message(flat), AllOf(HasSubstr(Dir("flat")), HasSubstr("no class folders")));
  auto missing = ReadImageFolders(Dir("nowhere"), "", {});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(Message(missing), HasSubstr(Dir("nowhere")));
}

TEST_F(ImageFolderTest, ATestFolderWithOtherClassesIsAnErrorNamingBoth) {
  Put("train", "cat", "1.png", 4, 4, 1, 10);
  Put("train", "dog", "1.png", 4, 4, 1, 10);
  Put("test", "cat", "1.png", 4, 4, 1, 10);
  Put("test", "cow", "1.png", 4, 4, 1, 10);
  auto other = ReadImageFolders(Dir("train"), Dir("test"), {});
  ASSERT_FALSE(other.ok());
  EXPECT_THAT(Message(other),
              AllOf(HasSubstr(Dir("train")), HasSubstr(Dir("test")), HasSubstr("cow")));
}

TEST_F(ImageFolderTest, MoreImagesThanTheUploadLimitAreRefusedBeforeDecodingThemAll) {
  for (int i = 0; i < 10; ++i) Put("train", "a", std::to_string(i) + ".png", 16, 16, 1, 1);
  ImageFolderOptions small;
  small.max_bytes = 1000;
  auto big = ReadImageFolders(Dir("train"), "", small);
  ASSERT_FALSE(big.ok());
  EXPECT_THAT(Message(big), AllOf(HasSubstr("10 images"), HasSubstr("16x16")));
}

#endif

}  // namespace
}  // namespace kiln::client
