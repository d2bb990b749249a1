// A reader for CSV tables of numeric features and one integer label column: rows of comma-
// separated cells (no quoting), an optional header row, blank lines skipped.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/data/dataset.h"

namespace kiln {

// Most feature columns: each is standardised as one normalisation channel (kMaxNormChannels).
inline constexpr int kMaxCsvFeatures = 256;
// Labels are class ids 0..kMaxCsvClasses-1.
inline constexpr int kMaxCsvClasses = 1 << 16;
// Longest line, in bytes: a bound on what a streaming check holds.
inline constexpr size_t kMaxCsvLineBytes = size_t{1} << 20;
// The file names a CSV dataset folder holds.
inline constexpr char kCsvTrainFile[] = "train.csv";
inline constexpr char kCsvTestFile[] = "test.csv";

enum class CsvHeader { kAuto, kPresent, kAbsent };

struct CsvOptions {
  // The label column: a header name, or a 0-based index; empty means the last column.
  std::string label_column;
  // kAuto: the first row is a header when any of its cells is not a number.
  CsvHeader header = CsvHeader::kAuto;
  // Without a test file, this share of the train file's rows (its last ones) is the test split;
  // in [0, 1).
  double test_fraction = 0.0;
};

// Checks (and, when asked, keeps) a CSV file as its bytes stream past in pieces of any size.
// Errors are InvalidArgument naming the file, the 1-based line and the column: a cell that is not
// a finite number, a label that is not an integer class id, a row whose cell count differs from
// the first row's, an unknown label column. Not thread-safe.
class CsvStreamCheck {
 public:
  enum class Keep { kCountsOnly, kValues };
  CsvStreamCheck(std::string name, CsvOptions options, Keep keep)
      : name_(std::move(name)), options_(std::move(options)), keep_(keep) {}

  absl::Status Consume(std::string_view bytes);
  // Ends the input: checks its last line and that it held at least one data row.
  absl::Status Finish();

  int64_t rows() const { return rows_; }
  int64_t features() const { return columns_ - 1; }
  int max_label() const { return max_label_; }
  // The column names (from the header, or "column <i>"), label column included.
  const std::vector<std::string>& column_names() const { return names_; }
  // With Keep::kValues: rows() x features() floats, row-major; and rows() labels.
  std::vector<float>& values() { return values_; }
  std::vector<int32_t>& labels() { return labels_; }

 private:
  absl::Status Line(std::string_view line);
  absl::Status Setup(const std::vector<std::string_view>& cells, bool header);

  std::string name_;
  CsvOptions options_;
  Keep keep_;
  std::string partial_;  // the current line until its newline
  int64_t line_no_ = 0;
  int64_t columns_ = 0;  // 0 until the first row
  int64_t label_index_ = -1;
  std::vector<std::string> names_;
  int64_t rows_ = 0;
  int max_label_ = -1;
  std::vector<float> values_;
  std::vector<int32_t> labels_;
};

// Loads a CSV dataset folder (train.csv and optionally test.csv, or a test_fraction split): float
// features of sample shape {F}, int labels. The test split must have the train split's columns.
absl::StatusOr<DatasetSplits> LoadCsvFolder(const std::string& dir, const CsvOptions& options);

// Parses CSV text already in memory (tests, and one split of LoadCsvFolder).
absl::StatusOr<Dataset> ParseCsv(std::string_view text, const std::string& name,
                                 const CsvOptions& options);

// Per-feature means and standard deviations over a float dataset (population std; a constant
// feature gets std 1 so it maps to 0): the standardisation a CSV model is trained and served with.
PixelNorm FeatureStandardisation(const Dataset& train);

}  // namespace kiln
