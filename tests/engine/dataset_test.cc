#include "engine/data/dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string MakeIdx(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& payload) {
  std::string s = {'\0', '\0', '\x08', static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) s += static_cast<char>((d >> shift) & 0xff);
  }
  s.append(payload.begin(), payload.end());
  return s;
}

enum class Compression { kRaw, kGzip };

class DatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           absl::StrCat("kiln_dataset_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes `bytes` to dir/name, or gzipped to dir/name.gz; returns the path written.
  std::string Write(const std::string& name, const std::string& bytes,
                    Compression c = Compression::kRaw) const {
    if (c == Compression::kRaw) {
      std::string path = Path(name);
      std::ofstream(path, std::ios::binary) << bytes;
      return path;
    }
    std::string path = Path(name + ".gz");
    gzFile gz = gzopen(path.c_str(), "wb");
    EXPECT_NE(gz, nullptr);
    EXPECT_EQ(gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    EXPECT_EQ(gzclose(gz), Z_OK);
    return path;
  }

  // n images of 2x3 pixels (pixel value = 10 * sample + index) and the given labels.
  void WriteSplit(const std::string& prefix, const std::vector<uint8_t>& labels,
                  Compression c = Compression::kRaw) const {
    const auto n = static_cast<uint32_t>(labels.size());
    std::vector<uint8_t> pixels;
    for (uint32_t s = 0; s < n; ++s) {
      for (int i = 0; i < 6; ++i) pixels.push_back(static_cast<uint8_t>(10 * s + i));
    }
    Write(prefix + "-images-idx3-ubyte", MakeIdx({n, 2, 3}, pixels), c);
    Write(prefix + "-labels-idx1-ubyte", MakeIdx({n}, labels), c);
  }

  fs::path dir_;
};

TEST_F(DatasetTest, LoadsImagesAndLabels) {
  std::string images = Write("imgs", MakeIdx({3, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  std::string labels = Write("lbls", MakeIdx({3}, {0, 4, 1}));
  absl::StatusOr<Dataset> ds = LoadImagesAndLabels(images, labels);
  ASSERT_OK(ds) << ds.status();
  EXPECT_EQ(ds->size, 3);
  EXPECT_THAT(ds->sample_shape, ElementsAre(2, 2));
  EXPECT_EQ(ds->sample_elems(), 4);
  EXPECT_EQ(ds->pixels.size(), 12u);
  EXPECT_EQ(ds->pixels[5], 5);
  EXPECT_THAT(ds->labels, ElementsAre(0, 4, 1));
  EXPECT_EQ(ds->num_classes, 5);
}

TEST_F(DatasetTest, Label255GivesTwoHundredFiftySixClasses) {
  std::string images = Write("imgs", MakeIdx({2, 1, 1}, {7, 8}));
  std::string labels = Write("lbls", MakeIdx({2}, {255, 3}));
  absl::StatusOr<Dataset> ds = LoadImagesAndLabels(images, labels);
  ASSERT_OK(ds) << ds.status();
  EXPECT_THAT(ds->labels, ElementsAre(255, 3));
  EXPECT_EQ(ds->num_classes, 256);
}

TEST_F(DatasetTest, CountMismatchNamesBothFiles) {
  std::string images = Write("imgs", MakeIdx({3, 1, 1}, {1, 2, 3}));
  std::string labels = Write("lbls", MakeIdx({2}, {0, 1}));
  absl::StatusOr<Dataset> ds = LoadImagesAndLabels(images, labels);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ds.status().message(),
              AllOf(HasSubstr("count mismatch"), HasSubstr(images), HasSubstr(labels),
                    HasSubstr("3 images"), HasSubstr("2 labels")));
}

TEST_F(DatasetTest, WrongRanksAreRejected) {
  std::string rank1 = Write("rank1", MakeIdx({2}, {0, 1}));
  std::string rank3 = Write("rank3", MakeIdx({2, 1, 1}, {0, 1}));
  absl::StatusOr<Dataset> ds = LoadImagesAndLabels(rank1, rank1);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ds.status().message(), AllOf(HasSubstr(rank1), HasSubstr("rank")));
  ds = LoadImagesAndLabels(rank3, rank3);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ds.status().message(), AllOf(HasSubstr(rank3), HasSubstr("rank")));
}

TEST_F(DatasetTest, ReaderErrorsPropagateWithTheFileName) {
  std::string images = Write("imgs", MakeIdx({3, 2, 2}, {1, 2, 3}));  // truncated
  std::string labels = Write("lbls", MakeIdx({3}, {0, 1, 2}));
  absl::StatusOr<Dataset> ds = LoadImagesAndLabels(images, labels);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(ds.status().message(), AllOf(HasSubstr(images), HasSubstr("truncated")));
  ds = LoadImagesAndLabels(images, Path("missing"));
  EXPECT_FALSE(ds.ok());
}

TEST_F(DatasetTest, LoadsRawFolder) {
  WriteSplit("train", {0, 1, 2, 1});
  WriteSplit("t10k", {2, 0});
  absl::StatusOr<DatasetSplits> splits = LoadImageFolder(dir_.string());
  ASSERT_OK(splits) << splits.status();
  EXPECT_EQ(splits->train.size, 4);
  EXPECT_THAT(splits->train.sample_shape, ElementsAre(2, 3));
  EXPECT_EQ(splits->train.pixels.size(), 24u);
  EXPECT_EQ(splits->train.pixels[6], 10);  // first pixel of sample 1
  EXPECT_THAT(splits->train.labels, ElementsAre(0, 1, 2, 1));
  EXPECT_EQ(splits->train.num_classes, 3);
  EXPECT_EQ(splits->test.size, 2);
  EXPECT_THAT(splits->test.labels, ElementsAre(2, 0));
}

TEST_F(DatasetTest, LoadsGzipFolder) {
  WriteSplit("train", {3, 1, 2}, Compression::kGzip);
  WriteSplit("t10k", {0}, Compression::kGzip);
  ASSERT_TRUE(fs::exists(dir_ / "train-images-idx3-ubyte.gz"));
  absl::StatusOr<DatasetSplits> splits = LoadImageFolder(dir_.string());
  ASSERT_OK(splits) << splits.status();
  EXPECT_EQ(splits->train.size, 3);
  EXPECT_THAT(splits->train.labels, ElementsAre(3, 1, 2));
  EXPECT_EQ(splits->train.num_classes, 4);
  EXPECT_EQ(splits->test.size, 1);
}

TEST_F(DatasetTest, FolderWithoutTestFilesHasEmptyTestSplit) {
  WriteSplit("train", {0, 1});
  absl::StatusOr<DatasetSplits> splits = LoadImageFolder(dir_.string());
  ASSERT_OK(splits) << splits.status();
  EXPECT_EQ(splits->train.size, 2);
  EXPECT_EQ(splits->test.size, 0);
  EXPECT_TRUE(splits->test.pixels.empty());
  EXPECT_TRUE(splits->test.labels.empty());
}

TEST_F(DatasetTest, MissingTrainFilesAreNotFound) {
  Write("train-images-idx3-ubyte", MakeIdx({1, 1, 1}, {0}));
  absl::StatusOr<DatasetSplits> splits = LoadImageFolder(dir_.string());
  EXPECT_EQ(splits.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(splits.status().message(),
              AllOf(HasSubstr(dir_.string()), HasSubstr("missing"),
                    HasSubstr("train-images-idx3-ubyte"), HasSubstr("train-labels-idx1-ubyte")));
}

TEST_F(DatasetTest, MissingFolderIsNotFound) {
  std::string missing = Path("no-such-folder");
  absl::StatusOr<DatasetSplits> splits = LoadImageFolder(missing);
  EXPECT_EQ(splits.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(splits.status().message(), AllOf(HasSubstr(missing), HasSubstr("does not exist")));
}

TEST_F(DatasetTest, HalfATestPairIsAnError) {
  WriteSplit("train", {0, 1});
  Write("t10k-images-idx3-ubyte", MakeIdx({1, 2, 3}, {1, 2, 3, 4, 5, 6}));
  absl::StatusOr<DatasetSplits> splits = LoadImageFolder(dir_.string());
  EXPECT_EQ(splits.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(splits.status().message(),
              AllOf(HasSubstr("t10k-images-idx3-ubyte"), HasSubstr("t10k-labels-idx1-ubyte")));
}

TEST_F(DatasetTest, TrainTestCountMismatchInFolderNamesBothFiles) {
  WriteSplit("train", {0, 1});
  Write("t10k-images-idx3-ubyte", MakeIdx({2, 2, 3}, std::vector<uint8_t>(12)));
  Write("t10k-labels-idx1-ubyte", MakeIdx({3}, {0, 1, 0}), Compression::kGzip);
  absl::StatusOr<DatasetSplits> splits = LoadImageFolder(dir_.string());
  EXPECT_EQ(splits.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(splits.status().message(),
              AllOf(HasSubstr("count mismatch"), HasSubstr(Path("t10k-images-idx3-ubyte")),
                    HasSubstr(Path("t10k-labels-idx1-ubyte.gz"))));
}

TEST_F(DatasetTest, TestShapeDifferentFromTrainIsRejected) {
  WriteSplit("train", {0, 1});
  Write("t10k-images-idx3-ubyte", MakeIdx({1, 3, 2}, std::vector<uint8_t>(6)));
  Write("t10k-labels-idx1-ubyte", MakeIdx({1}, {0}));
  absl::StatusOr<DatasetSplits> splits = LoadImageFolder(dir_.string());
  EXPECT_EQ(splits.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(splits.status().message(),
              AllOf(HasSubstr("shape mismatch"), HasSubstr("2x3"), HasSubstr("3x2")));
}

// Real data sets, when present: KILN_TEST_MNIST_DIR (tests/CMakeLists.txt points it at
// data/mnist, filled by scripts/fetch-mnist) and Debian's dataset-fashion-mnist.
void ExpectMnistShaped(const std::string& dir) {
  absl::StatusOr<DatasetSplits> splits = LoadImageFolder(dir);
  ASSERT_OK(splits) << splits.status();
  EXPECT_EQ(splits->train.size, 60000);
  EXPECT_EQ(splits->test.size, 10000);
  EXPECT_THAT(splits->train.sample_shape, ElementsAre(28, 28));
  EXPECT_THAT(splits->test.sample_shape, ElementsAre(28, 28));
  EXPECT_EQ(splits->train.pixels.size(), 60000u * 28 * 28);
  EXPECT_EQ(splits->test.pixels.size(), 10000u * 28 * 28);
  EXPECT_EQ(splits->train.num_classes, 10);
  EXPECT_EQ(splits->test.num_classes, 10);
}

TEST(RealDatasetTest, LoadsRealMnist) {
  const char* env = std::getenv("KILN_TEST_MNIST_DIR");
  if (env == nullptr || !fs::is_directory(env)) {
    GTEST_SKIP() << "real MNIST not available: set KILN_TEST_MNIST_DIR to a folder filled by "
                    "scripts/fetch-mnist (now "
                 << (env ? absl::StrCat("'", env, "', which is not a folder") : "unset") << ")";
  }
  ExpectMnistShaped(env);
  absl::StatusOr<DatasetSplits> splits = LoadImageFolder(env);
  ASSERT_OK(splits) << splits.status();
  // The first labels of the original files: 5 0 4 1 9 (train) and 7 2 1 0 4 (test).
  EXPECT_THAT(std::vector<int32_t>(splits->train.labels.begin(), splits->train.labels.begin() + 5),
              ElementsAre(5, 0, 4, 1, 9));
  EXPECT_THAT(std::vector<int32_t>(splits->test.labels.begin(), splits->test.labels.begin() + 5),
              ElementsAre(7, 2, 1, 0, 4));
}

TEST(RealDatasetTest, LoadsDebianFashionMnist) {
  const char* env = std::getenv("KILN_TEST_FASHION_MNIST_DIR");
  const std::string dir = env ? env : "/usr/share/datasets/fashion-mnist";
  if (!fs::is_directory(dir)) {
    GTEST_SKIP() << "Fashion-MNIST not available at " << dir
                 << " (apt-get install dataset-fashion-mnist, or set KILN_TEST_FASHION_MNIST_DIR)";
  }
  ExpectMnistShaped(dir);
}

}  // namespace
}  // namespace kiln
