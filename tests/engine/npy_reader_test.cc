// NumPy .npy arrays: headers of every version checked, dtypes and shapes refused by name,
// truncation and trailing bytes as DataLoss, folders of train_x/train_y loaded as pixels or
// float features.
#include "engine/data/npy_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/engine/test_util.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// An .npy file as numpy.save writes it (version 1, header padded to 64 bytes).
std::string Npy(const std::string& descr, const std::vector<int64_t>& shape,
                const std::string& data, int version = 1, const char* order = "False") {
  std::string dims = absl::StrJoin(shape, ", ");
  if (shape.size() == 1) dims += ",";
  std::string dict = absl::StrCat("{'descr': '", descr, "', 'fortran_order': ", order,
                                  ", 'shape': (", dims, "), }");
  const size_t prefix = version == 1 ? 10 : 12;
  while ((prefix + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(version);
  out += '\0';
  const size_t len = dict.size();
  out += static_cast<char>(len & 0xff);
  out += static_cast<char>((len >> 8) & 0xff);
  if (version != 1) out += std::string(2, '\0');
  return out + dict + data;
}

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

TEST(NpyReaderTest, Uint8ImagesAndInt64LabelsBecomePixels) {
  std::string pixels(2 * 3 * 2 * 2, '\0');
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<char>(i);
  absl::StatusOr<Dataset> ds =
      ParseNpySplit(Npy("|u1", {2, 3, 2, 2}, pixels), "x.npy",
                    Npy("<i8", {2}, Bytes(std::vector<int64_t>{4, 1})), "y.npy");
  ASSERT_OK(ds);
  EXPECT_THAT(ds->sample_shape, ElementsAre(3, 2, 2));
  EXPECT_EQ(ds->size, 2);
  EXPECT_EQ(ds->pixels.size(), 24u);
  EXPECT_EQ(ds->pixels[13], 13);
  EXPECT_THAT(ds->labels, ElementsAre(4, 1));
  EXPECT_EQ(ds->num_classes, 5);
  EXPECT_FALSE(ds->has_features());
}

TEST(NpyReaderTest, Float32TablesBecomeFeaturesInEveryVersion) {
  for (int version : {1, 2, 3}) {
    absl::StatusOr<Dataset> ds =
        ParseNpySplit(Npy("<f4", {2, 2}, Bytes(std::vector<float>{1.5f, -2, 3, 4}), version),
                      "x.npy", Npy("|u1", {2}, std::string("\x01\x00", 2), version), "y.npy");
    ASSERT_OK(ds) << "version " << version;
    EXPECT_THAT(ds->features, ElementsAre(1.5f, -2.0f, 3.0f, 4.0f));
    EXPECT_THAT(ds->sample_shape, ElementsAre(2));
    EXPECT_THAT(ds->labels, ElementsAre(1, 0));
  }
}

TEST(NpyReaderTest, BadHeadersDtypesAndShapesAreRefusedNamingTheFile) {
  const std::string y = Npy("<i4", {1}, Bytes(std::vector<int32_t>{0}));
  auto err = [&](const std::string& x) {
    return std::string(ParseNpySplit(x, "x.npy", y, "y.npy").status().message());
  };
  EXPECT_THAT(err("PK\x03\x04 not numpy at all"),
              AllOf(HasSubstr("x.npy"), HasSubstr("\\x93NUMPY")));
  EXPECT_THAT(err(Npy("<f8", {1, 2}, std::string(16, '\0'))), HasSubstr("dtype <f8"));
  EXPECT_THAT(err(Npy(">f4", {1, 2}, std::string(8, '\0'))), HasSubstr("dtype >f4"));
  EXPECT_THAT(err(Npy("|u1", {1, 2}, "ab", 1, "True")), HasSubstr("Fortran order"));
  EXPECT_THAT(err(Npy("<f4", {1, 2, 2}, std::string(16, '\0'))), HasSubstr("(N, F) table"));
  EXPECT_THAT(err(Npy("<i4", {1, 2}, std::string(8, '\0'))), HasSubstr("uint8 or float32"));
  std::string v9 = Npy("|u1", {1, 1}, "a");
  v9[6] = 9;
  EXPECT_THAT(err(v9), HasSubstr("version 9"));
  EXPECT_THAT(ParseNpySplit(Npy("|u1", {1, 1}, "a"), "x.npy", Npy("<f4", {1}, std::string(4, '\0')),
                            "y.npy")
                  .status()
                  .message(),
              HasSubstr("y.npy: not a usable .npy file: labels must be"));
  EXPECT_THAT(ParseNpySplit(Npy("|u1", {1, 1}, "a"), "x.npy",
                            Npy("<i4", {1}, Bytes(std::vector<int32_t>{-3})), "y.npy")
                  .status()
                  .message(),
              HasSubstr("label -3 at element 0"));
  EXPECT_THAT(ParseNpySplit(Npy("|u1", {2, 1}, "ab"), "x.npy", y, "y.npy").status().message(),
              HasSubstr("count mismatch"));
}

TEST(NpyReaderTest, TruncatedAndOverlongDataAreDataLoss) {
  const std::string y = Npy("|u1", {2}, std::string(2, '\0'));
  absl::Status cut = ParseNpySplit(Npy("|u1", {2, 4}, "1234567"), "x.npy", y, "y.npy").status();
  EXPECT_EQ(cut.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(cut.message(), AllOf(HasSubstr("x.npy: truncated"), HasSubstr("8 bytes of data"),
                                   HasSubstr("has 7")));
  absl::Status extra = ParseNpySplit(Npy("|u1", {2, 4}, "123456789"), "x.npy", y, "y.npy").status();
  EXPECT_EQ(extra.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(extra.message(), HasSubstr("trailing bytes"));
  std::string header_only = Npy("|u1", {2, 4}, "").substr(0, 20);
  EXPECT_EQ(ParseNpySplit(header_only, "x.npy", y, "y.npy").status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(NpyReaderTest, TheStreamCheckAgreesWhateverThePieces) {
  const std::string y = Npy("<i8", {5}, Bytes(std::vector<int64_t>{0, 7, 2, 3, 1}));
  for (size_t piece : {size_t{1}, size_t{3}, size_t{50}, y.size()}) {
    NpyStreamCheck check("y.npy", NpyStreamCheck::Role::kLabels);
    for (size_t at = 0; at < y.size(); at += piece) {
      ASSERT_OK(check.Consume(std::string_view(y).substr(at, piece)));
    }
    ASSERT_OK(check.Finish());
    EXPECT_EQ(check.max_label(), 7);
    EXPECT_THAT(check.header().shape, ElementsAre(5));
  }
}

// A float table with NaN or inf is refused as its bytes stream past at upload (as a CSV table's
// are), naming the file and the element, wherever the pieces split a value.
TEST(NpyReaderTest, TheStreamCheckRefusesFloatsThatAreNotFinite) {
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (float v : bad) {
    const std::string x = Npy("<f4", {2, 2}, Bytes(std::vector<float>{1, 2, v, 4}));
    for (size_t piece : {size_t{1}, size_t{3}, x.size()}) {
      NpyStreamCheck check("train_x.npy", NpyStreamCheck::Role::kSamples);
      absl::Status s;
      for (size_t at = 0; at < x.size() && s.ok(); at += piece) {
        s = check.Consume(std::string_view(x).substr(at, piece));
      }
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << v << " in pieces of " << piece;
      EXPECT_THAT(s.message(),
                  AllOf(HasSubstr("train_x.npy"), HasSubstr("element 2"), HasSubstr("not finite")));
    }
  }
  const std::string good = Npy("<f4", {2, 2}, Bytes(std::vector<float>{1, 2, 3, 4}));
  NpyStreamCheck check("train_x.npy", NpyStreamCheck::Role::kSamples);
  ASSERT_OK(check.Consume(good));
  ASSERT_OK(check.Finish());
}

TEST(NpyReaderTest, AFolderLoadsBothSplits) {
  testing::TempDir dir;
  auto write = [&](const char* name, const std::string& bytes) {
    std::ofstream(dir.file(name), std::ios::binary) << bytes;
  };
  write("train_x.npy", Npy("<f4", {3, 2}, Bytes(std::vector<float>{1, 2, 3, 4, 5, 6})));
  write("train_y.npy", Npy("<i4", {3}, Bytes(std::vector<int32_t>{0, 1, 2})));
  EXPECT_EQ(DetectDatasetFormat(dir.path()), DatasetFormat::kNpy);
  write("test_x.npy", Npy("<f4", {1, 2}, Bytes(std::vector<float>{7, 8})));
  EXPECT_EQ(LoadNpyFolder(dir.path()).status().code(), absl::StatusCode::kNotFound)
      << "test_x.npy without test_y.npy";
  write("test_y.npy", Npy("<i4", {1}, Bytes(std::vector<int32_t>{3})));
  absl::StatusOr<DatasetSplits> splits = LoadDatasetFolder(dir.path(), DatasetFormat::kNpy);
  ASSERT_OK(splits);
  EXPECT_EQ(splits->train.size, 3);
  EXPECT_EQ(splits->test.size, 1);
  EXPECT_EQ(splits->train.num_classes, 4);
  write("test_x.npy", Npy("<f4", {1, 1}, Bytes(std::vector<float>{7})));
  EXPECT_THAT(LoadNpyFolder(dir.path()).status().message(), HasSubstr("shape and dtype"));
}

}  // namespace
}  // namespace kiln
