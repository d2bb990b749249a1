// CSV tables: header detection, the label column by name or index, errors naming line and column,
// a test split from a file or a fraction, per-feature standardisation, and training on them.
#include "engine/data/csv_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/backend_registry.h"
#include "engine/model/checkpoint.h"
#include "engine/inference.h"
#include "engine/trainer.h"
#include "tests/engine/test_util.h"
#include "tests/support/status_matchers.h"

namespace kiln {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(CsvReaderTest, AHeaderIsDetectedAndTheLastColumnIsTheLabel) {
  absl::StatusOr<Dataset> ds = ParseCsv("a,b,label\n1,2.5,0\n-3, 4e1 ,2\r\n\n", "t.csv", {});
  ASSERT_OK(ds);
  EXPECT_EQ(ds->size, 2);
  EXPECT_THAT(ds->sample_shape, ElementsAre(2));
  EXPECT_THAT(ds->features, ElementsAre(1.0f, 2.5f, -3.0f, 40.0f));
  EXPECT_THAT(ds->labels, ElementsAre(0, 2));
  EXPECT_EQ(ds->num_classes, 3);
  EXPECT_TRUE(ds->has_features());
  EXPECT_TRUE(ds->pixels.empty());
}

TEST(CsvReaderTest, TheLabelColumnGoesByNameOrIndexAndHeaderlessFilesWork) {
  CsvOptions by_name;
  by_name.label_column = "y";
  absl::StatusOr<Dataset> ds = ParseCsv("y,x1,x2\n1,5,6\n0,7,8", "t.csv", by_name);
  ASSERT_OK(ds);
  EXPECT_THAT(ds->features, ElementsAre(5, 6, 7, 8));
  EXPECT_THAT(ds->labels, ElementsAre(1, 0));
  CsvOptions by_index;
  by_index.label_column = "0";
  ds = ParseCsv("1,5,6\n0,7,8\n", "t.csv", by_index);
  ASSERT_OK(ds);
  EXPECT_EQ(ds->size, 2) << "an all-numeric first row is data";
  EXPECT_THAT(ds->labels, ElementsAre(1, 0));
  CsvOptions forced;
  forced.header = CsvHeader::kPresent;
  ds = ParseCsv("1,5,6\n0,7,8\n", "t.csv", forced);
  ASSERT_OK(ds);
  EXPECT_EQ(ds->size, 1);
  CsvOptions unknown;
  unknown.label_column = "z";
  EXPECT_THAT(ParseCsv("y,x\n1,2\n", "t.csv", unknown).status().message(),
              AllOf(HasSubstr("t.csv"), HasSubstr("label column \"z\"")));
}

TEST(CsvReaderTest, ANonNumericCellNamesTheLineAndColumn) {
  absl::Status s = ParseCsv("a,b,label\n1,2,0\n3,abc,1\n", "t.csv", {}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("t.csv: line 3, column 2 (b)"), HasSubstr("\"abc\""),
                                 HasSubstr("not a finite number")));
  EXPECT_THAT(ParseCsv("a,label\nnan,0\n", "t.csv", {}).status().message(),
              HasSubstr("line 2, column 1"));
  EXPECT_THAT(ParseCsv("a,label\n1,0.5\n", "t.csv", {}).status().message(),
              AllOf(HasSubstr("line 2, column 2 (label)"), HasSubstr("not a class id")));
  EXPECT_THAT(ParseCsv("a,label\n1,-1\n", "t.csv", {}).status().message(),
              HasSubstr("not a class id"));
}

TEST(CsvReaderTest, RaggedRowsAndEmptyTablesAreRefused) {
  EXPECT_THAT(ParseCsv("a,b,label\n1,2,0\n1,2\n", "t.csv", {}).status().message(),
              HasSubstr("t.csv: line 3 has 2 cells but the table has 3 columns"));
  EXPECT_THAT(ParseCsv("a,b,label\n", "t.csv", {}).status().message(), HasSubstr("no data rows"));
  EXPECT_THAT(ParseCsv("", "t.csv", {}).status().message(), HasSubstr("no data rows"));
  EXPECT_THAT(ParseCsv("label\n1\n", "t.csv", {}).status().message(),
              HasSubstr("at least one feature column"));
}

TEST(CsvReaderTest, TheStreamCheckAgreesWhateverThePieces) {
  std::string text = "f1,f2,label\n";
  for (int i = 0; i < 50; ++i) absl::StrAppend(&text, i, ",", i * 0.5, ",", i % 4, "\n");
  for (size_t piece : {size_t{1}, size_t{7}, size_t{64}, text.size()}) {
    CsvStreamCheck check("t.csv", {}, CsvStreamCheck::Keep::kCountsOnly);
    for (size_t at = 0; at < text.size(); at += piece) {
      ASSERT_OK(check.Consume(std::string_view(text).substr(at, piece)));
    }
    ASSERT_OK(check.Finish());
    EXPECT_EQ(check.rows(), 50);
    EXPECT_EQ(check.features(), 2);
    EXPECT_EQ(check.max_label(), 3);
  }
}

TEST(CsvReaderTest, StandardisationUsesTheTrainSplitsMeanAndStd) {
  absl::StatusOr<Dataset> ds = ParseCsv("a,b,label\n1,5,0\n3,5,1\n", "t.csv", {});
  ASSERT_OK(ds);
  const PixelNorm n = FeatureStandardisation(*ds);
  EXPECT_EQ(n.input, NormInput::kFeatures);
  EXPECT_FLOAT_EQ(n.scale, 1.0f);
  EXPECT_THAT(n.channel_mean, ElementsAre(2.0f, 5.0f));
  EXPECT_THAT(n.channel_std, ElementsAre(1.0f, 1.0f)) << "a constant column keeps std 1";
}

class CsvFolderTest : public ::testing::Test {
 protected:
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_.file(name), std::ios::binary) << text;
  }
  testing::TempDir dir_;
};

// Two features far from unit scale; the label is which side of a line the point lies.
std::string LinearTable(int rows, int seed) {
  std::string text = "x,y,label\n";
  uint32_t s = static_cast<uint32_t>(seed) * 2654435761u + 7;
  for (int i = 0; i < rows; ++i) {
    s = s * 1664525u + 1013904223u;
    const double x = 1000.0 + (s >> 8) % 1000;
    s = s * 1664525u + 1013904223u;
    const double y = -0.01 * ((s >> 8) % 1000);
    const int label = (x - 1500.0) / 500.0 + y / 5.0 > 0 ? 1 : 0;
    absl::StrAppend(&text, x, ",", y, ",", label, "\n");
  }
  return text;
}

TEST_F(CsvFolderTest, AFractionSplitsOffTheLastRowsAsTheTestSplit) {
  Write("train.csv", LinearTable(100, 1));
  CsvOptions options;
  options.test_fraction = 0.2;
  absl::StatusOr<DatasetSplits> splits = LoadCsvFolder(dir_.path(), options);
  ASSERT_OK(splits);
  EXPECT_EQ(splits->train.size, 80);
  EXPECT_EQ(splits->test.size, 20);
  EXPECT_EQ(splits->train.features.size(), 160u);
  EXPECT_EQ(splits->test.features.size(), 40u);
  EXPECT_EQ(DetectDatasetFormat(dir_.path()), DatasetFormat::kCsv);
  options.test_fraction = 0.001;
  EXPECT_THAT(LoadCsvFolder(dir_.path(), options).status().message(), HasSubstr("empty split"));
  Write("test.csv", "x,label\n1,0\n");
  EXPECT_THAT(LoadCsvFolder(dir_.path(), {}).status().message(),
              HasSubstr("1 feature columns but"));
}

TEST_F(CsvFolderTest, AnMlpLearnsATableAndServingStandardisesAsTraining) {
  Write("train.csv", LinearTable(400, 1));
  Write("test.csv", LinearTable(100, 2));
  absl::StatusOr<DatasetSplits> splits = LoadDatasetFolder(dir_.path(), DatasetFormat::kCsv);
  ASSERT_OK(splits);
  auto b = CreateBackend("cpu", {2});
  ASSERT_OK(b);
  TrainConfig c;
  c.model.input_shape = {2};
  c.model.layers = {LinearConfig{2, 16}, ReluConfig{}, LinearConfig{16, 2}};
  c.optimizer.kind = OptimizerConfig::Kind::kAdam;
  c.optimizer.lr = 0.02f;
  c.batch_size = 32;
  c.epochs = 15;
  auto t = Trainer::Create(c, b->get(), &splits->train, &splits->test);
  ASSERT_OK(t);
  ASSERT_OK((*t)->Run({}));
  const double accuracy = (*(*t)->Evaluate(splits->test)).accuracy;
  EXPECT_GT(accuracy, 0.9) << "unstandardised, x in the thousands would not train this well";
  ASSERT_OK((*t)->SaveCheckpoint(dir_.file("m.safetensors")));

  auto s = InferenceSession::FromCheckpoint(dir_.file("m.safetensors"), b->get(), 100);
  ASSERT_OK(s);
  EXPECT_EQ((*s)->norm().input, NormInput::kFeatures);
  EXPECT_EQ((*s)->input_shape(), Shape({2}));
  std::vector<float> probs(200);
  std::vector<int32_t> cls(100);
  ASSERT_OK((*s)->PredictF32(splits->test.features.data(), 100, probs.data(), cls.data()));
  int hits = 0;
  for (int i = 0; i < 100; ++i) hits += cls[i] == splits->test.labels[i];
  EXPECT_DOUBLE_EQ(hits / 100.0, accuracy);
  std::vector<uint8_t> u8(2);
  EXPECT_EQ((*s)->PredictU8(u8.data(), 1, probs.data(), cls.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln
