// The CIFAR-10 binary reader: records checked one by one, truncation and bad labels named by
// file and byte offset, folders of data_batch_<N>.bin loaded in the order of N.
#include "engine/data/cifar10_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "tests/engine/test_util.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// `labels.size()` records; record r's pixel i is (r * 31 + i) mod 256.
std::string MakeCifar(const std::vector<uint8_t>& labels) {
  std::string s;
  for (size_t r = 0; r < labels.size(); ++r) {
    s += static_cast<char>(labels[r]);
    for (int64_t i = 0; i < kCifar10ImageBytes; ++i) {
      s += static_cast<char>((r * 31 + i) & 0xff);
    }
  }
  return s;
}

class Cifar10ReaderTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& bytes) const {
    const std::string path = dir_.file(name);
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  testing::TempDir dir_;
};

TEST_F(Cifar10ReaderTest, ParsesRecordsAsChwImagesWithTheirLabels) {
  absl::StatusOr<Dataset> ds = ParseCifar10(MakeCifar({3, 0, 9}), "batch");
  ASSERT_OK(ds);
  EXPECT_EQ(ds->size, 3);
  EXPECT_THAT(ds->sample_shape, ElementsAre(3, 32, 32));
  EXPECT_THAT(ds->labels, ElementsAre(3, 0, 9));
  EXPECT_EQ(ds->num_classes, 10);
  ASSERT_EQ(ds->pixels.size(), 3u * 3072u);
  // Record 1's blue channel starts 2048 bytes into its image.
  EXPECT_EQ(ds->pixels[3072 + 2048], static_cast<uint8_t>((31 + 2048) & 0xff));
  EXPECT_EQ(ds->pixels[2 * 3072 + 5], static_cast<uint8_t>((62 + 5) & 0xff));
}

TEST_F(Cifar10ReaderTest, TruncatedFileIsDataLossNamingFileAndOffset) {
  std::string bytes = MakeCifar({1, 2, 3});
  bytes.resize(bytes.size() - 100);
  const std::string path = Write("data_batch_1.bin", bytes);
  absl::StatusOr<Dataset> ds = ReadCifar10File(path);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(ds.status().message(),
              AllOf(HasSubstr(path), HasSubstr("truncated"), HasSubstr("byte offset 6146"),
                    HasSubstr("2973 of its 3073 bytes")));
}

TEST_F(Cifar10ReaderTest, LabelOutOfRangeNamesTheRecordAndOffset) {
  absl::StatusOr<Dataset> ds = ParseCifar10(MakeCifar({0, 1, 10}), "b.bin");
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ds.status().message(),
              AllOf(HasSubstr("b.bin"), HasSubstr("record 2 at byte offset 6146"),
                    HasSubstr("label 10"), HasSubstr("0..9")));
}

TEST_F(Cifar10ReaderTest, GzipInputIsToldApart) {
  std::string bytes = MakeCifar({0});
  bytes[0] = '\x1f';
  bytes[1] = '\x8b';
  absl::StatusOr<Dataset> ds = ParseCifar10(bytes, "b.bin");
  EXPECT_THAT(ds.status().message(), HasSubstr("gzip"));
}

TEST_F(Cifar10ReaderTest, EmptyFileIsDataLoss) {
  absl::StatusOr<Dataset> ds = ReadCifar10File(Write("e.bin", ""));
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(ds.status().message(), HasSubstr("empty"));
}

TEST_F(Cifar10ReaderTest, OversizedFileIsRefusedNamingTheLimit) {
  const std::string path = Write("big.bin", MakeCifar({0, 1, 2}));
  EXPECT_OK(ReadCifar10File(path, 3 * kCifar10RecordBytes));
  absl::StatusOr<Dataset> ds = ReadCifar10File(path, 2 * kCifar10RecordBytes);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ds.status().message(),
              AllOf(HasSubstr(path), HasSubstr("too large"), HasSubstr("6146 bytes")));
}

TEST_F(Cifar10ReaderTest, MissingFileAndFolderAreNotFound) {
  EXPECT_EQ(ReadCifar10File(dir_.file("none.bin")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadCifar10Folder(dir_.file("none")).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<DatasetSplits> empty = LoadCifar10Folder(dir_.path());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(empty.status().message(), HasSubstr("data_batch_"));
}

TEST_F(Cifar10ReaderTest, StreamCheckAgreesWhateverThePieces) {
  const std::string bytes = MakeCifar({4, 7, 2, 0});
  for (size_t piece : {size_t{1}, size_t{1000}, size_t{3073}, size_t{5000}, bytes.size()}) {
    Cifar10StreamCheck check("f");
    for (size_t at = 0; at < bytes.size(); at += piece) {
      ASSERT_OK(check.Consume(std::string_view(bytes).substr(at, piece)));
    }
    ASSERT_OK(check.Finish());
    EXPECT_EQ(check.records(), 4);
    EXPECT_EQ(check.max_label(), 7);
  }
  std::string bad = bytes;
  bad[3 * kCifar10RecordBytes] = 12;
  Cifar10StreamCheck check("f");
  absl::Status s;
  for (size_t at = 0; at < bad.size() && s.ok(); at += 1000) {
    s = check.Consume(std::string_view(bad).substr(at, 1000));
  }
  EXPECT_THAT(s.message(), HasSubstr("record 3 at byte offset 9219 has label 12"));
}

TEST_F(Cifar10ReaderTest, TrainFileNamesAreNumberedBatches) {
  EXPECT_EQ(Cifar10TrainFileNumber("data_batch_1.bin"), 1);
  EXPECT_EQ(Cifar10TrainFileNumber("data_batch_64.bin"), 64);
  EXPECT_EQ(Cifar10TrainFileNumber("data_batch_65.bin"), 0);
  EXPECT_EQ(Cifar10TrainFileNumber("data_batch_0.bin"), 0);
  EXPECT_EQ(Cifar10TrainFileNumber("data_batch_01.bin"), 0);
  EXPECT_EQ(Cifar10TrainFileNumber("data_batch_.bin"), 0);
  EXPECT_EQ(Cifar10TrainFileNumber("data_batch_1.bin.gz"), 0);
  EXPECT_EQ(Cifar10TrainFileNumber("test_batch.bin"), 0);
}

TEST_F(Cifar10ReaderTest, FolderJoinsTrainBatchesInNumericOrder) {
  Write("data_batch_10.bin", MakeCifar({9}));
  Write("data_batch_2.bin", MakeCifar({2, 2}));
  Write("data_batch_1.bin", MakeCifar({1}));
  Write("test_batch.bin", MakeCifar({5, 6}));
  Write("batches.meta.txt", "airplane\n");
  EXPECT_EQ(DetectDatasetFormat(dir_.path()), DatasetFormat::kCifar10);
  absl::StatusOr<DatasetSplits> splits = LoadDatasetFolder(dir_.path(), DatasetFormat::kCifar10);
  ASSERT_OK(splits);
  EXPECT_THAT(splits->train.labels, ElementsAre(1, 2, 2, 9));
  EXPECT_EQ(splits->train.size, 4);
  EXPECT_EQ(splits->train.pixels.size(), 4u * 3072u);
  EXPECT_EQ(splits->train.num_classes, 10);
  EXPECT_THAT(splits->test.labels, ElementsAre(5, 6));
  EXPECT_THAT(splits->test.sample_shape, ElementsAre(3, 32, 32));
}

TEST_F(Cifar10ReaderTest, ABadBatchInAFolderIsNamed) {
  Write("data_batch_1.bin", MakeCifar({1}));
  std::string cut = MakeCifar({1});
  cut.pop_back();
  const std::string bad = Write("data_batch_2.bin", cut);
  absl::StatusOr<DatasetSplits> splits = LoadCifar10Folder(dir_.path());
  EXPECT_EQ(splits.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(splits.status().message(), HasSubstr(bad));
}

TEST_F(Cifar10ReaderTest, FormatNamesRoundTrip) {
  for (DatasetFormat f : {DatasetFormat::kIdx, DatasetFormat::kCifar10}) {
    EXPECT_EQ(DatasetFormatFromName(DatasetFormatName(f)), f);
  }
  EXPECT_EQ(DatasetFormatFromName("png"), std::nullopt);
  EXPECT_EQ(DetectDatasetFormat(dir_.path()), DatasetFormat::kIdx);
}

}  // namespace
}  // namespace kiln
