#include "engine/data/csv_reader.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <new>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "engine/data/data_file.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// Cells with surrounding blanks trimmed; a trailing '\r' (CRLF files) is already gone.
std::vector<std::string_view> SplitCells(std::string_view line) {
  std::vector<std::string_view> cells;
  for (absl::string_view cell : absl::StrSplit(absl::string_view(line.data(), line.size()), ',')) {
    absl::string_view t = absl::StripAsciiWhitespace(cell);
    cells.emplace_back(t.data(), t.size());
  }
  return cells;
}

bool ParseFloat(std::string_view cell, float* out) {
  return absl::SimpleAtof(absl::string_view(cell.data(), cell.size()), out) && std::isfinite(*out);
}

std::string Quoted(std::string_view cell) {
  constexpr size_t kMaxShown = 40;
  if (cell.size() <= kMaxShown) return absl::StrCat("\"", std::string(cell), "\"");
  return absl::StrCat("\"", std::string(cell.substr(0, kMaxShown)), "...\"");
}

}  // namespace

absl::Status CsvStreamCheck::Setup(const std::vector<std::string_view>& cells, bool header) {
  columns_ = static_cast<int64_t>(cells.size());
  if (columns_ < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": line ", line_no_, " has ", columns_,
                     " column; a table needs at least one feature column and the label column"));
  }
  if (columns_ - 1 > kMaxCsvFeatures) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": ", columns_ - 1,
                                                   " feature columns; at most ", kMaxCsvFeatures,
                                                   " are supported"));
  }
  for (int64_t i = 0; i < columns_; ++i) {
    names_.push_back(header ? std::string(cells[i]) : absl::StrCat("column ", i));
  }
  const std::string& want = options_.label_column;
  if (want.empty()) {
    label_index_ = columns_ - 1;
  } else if (auto it = std::find(names_.begin(), names_.end(), want);
             header && it != names_.end()) {
    label_index_ = it - names_.begin();
  } else if (int64_t index = 0; absl::SimpleAtoi(want, &index) && index >= 0 && index < columns_) {
    label_index_ = index;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": label column \"", want, "\" is neither ",
                     header ? "a column of the header nor " : "", "an index in 0..", columns_ - 1,
                     header ? "" : " (the file has no header row)"));
  }
  return absl::OkStatus();
}

absl::Status CsvStreamCheck::Line(std::string_view line) {
  ++line_no_;
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (absl::StripAsciiWhitespace(absl::string_view(line.data(), line.size())).empty()) {
    return absl::OkStatus();
  }
  std::vector<std::string_view> cells = SplitCells(line);
  if (columns_ == 0) {
    bool header = options_.header == CsvHeader::kPresent;
    if (options_.header == CsvHeader::kAuto) {
      float v;
      for (std::string_view c : cells) header = header || !ParseFloat(c, &v);
    }
    KILN_RETURN_IF_ERROR(Setup(cells, header));
    if (header) return absl::OkStatus();
  }
  if (static_cast<int64_t>(cells.size()) != columns_) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": line ", line_no_, " has ",
                                                   cells.size(), " cells but the table has ",
                                                   columns_, " columns"));
  }
  try {
    for (int64_t i = 0; i < columns_; ++i) {
      const std::string_view cell = cells[i];
      if (i == label_index_) {
        int64_t label = -1;
        if (!absl::SimpleAtoi(absl::string_view(cell.data(), cell.size()), &label) || label < 0 ||
            label >= kMaxCsvClasses) {
          return absl::InvalidArgumentError(absl::StrCat(
              name_, ": line ", line_no_, ", column ", i + 1, " (", names_[i], "): ", Quoted(cell),
              " is not a class id (an integer in 0..", kMaxCsvClasses - 1, ")"));
        }
        max_label_ = std::max(max_label_, static_cast<int>(label));
        if (keep_ == Keep::kValues) labels_.push_back(static_cast<int32_t>(label));
        continue;
      }
      float v = 0;
      if (!ParseFloat(cell, &v)) {
        return absl::InvalidArgumentError(absl::StrCat(name_, ": line ", line_no_, ", column ",
                                                       i + 1, " (", names_[i], "): ", Quoted(cell),
                                                       " is not a finite number"));
      }
      if (keep_ == Keep::kValues) values_.push_back(v);
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(name_, ": out of memory at line ", line_no_));
  }
  ++rows_;
  return absl::OkStatus();
}

absl::Status CsvStreamCheck::Consume(std::string_view bytes) {
  while (!bytes.empty()) {
    const size_t nl = bytes.find('\n');
    const std::string_view piece = bytes.substr(0, nl);
    if (partial_.size() + piece.size() > kMaxCsvLineBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          name_, ": line ", line_no_ + 1, " is longer than ", kMaxCsvLineBytes, " bytes"));
    }
    if (nl == std::string_view::npos) {
      partial_.append(piece.data(), piece.size());
      return absl::OkStatus();
    }
    if (partial_.empty()) {
      KILN_RETURN_IF_ERROR(Line(piece));
    } else {
      partial_.append(piece.data(), piece.size());
      KILN_RETURN_IF_ERROR(Line(partial_));
      partial_.clear();
    }
    bytes.remove_prefix(nl + 1);
  }
  return absl::OkStatus();
}

absl::Status CsvStreamCheck::Finish() {
  if (!partial_.empty()) {
    KILN_RETURN_IF_ERROR(Line(partial_));
    partial_.clear();
  }
  if (rows_ == 0) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": no data rows"));
  }
  return absl::OkStatus();
}

namespace {

// The dataset a finished check kept the values of (Keep::kValues); takes them.
Dataset DatasetOf(CsvStreamCheck& check) {
  Dataset ds;
  ds.sample_shape = {check.features()};
  ds.size = check.rows();
  ds.num_classes = check.max_label() + 1;
  ds.features = std::move(check.values());
  ds.labels = std::move(check.labels());
  return ds;
}

}  // namespace

absl::StatusOr<Dataset> ParseCsv(std::string_view text, const std::string& name,
                                 const CsvOptions& options) {
  CsvStreamCheck check(name, options, CsvStreamCheck::Keep::kValues);
  KILN_RETURN_IF_ERROR(check.Consume(text));
  KILN_RETURN_IF_ERROR(check.Finish());
  return DatasetOf(check);
}

namespace {

absl::StatusOr<Dataset> ReadCsvFile(const std::string& path, const CsvOptions& options) {
  KILN_ASSIGN_OR_RETURN(DataFile file, OpenDataFile(path, "a CSV file"));
  CsvStreamCheck check(path, options, CsvStreamCheck::Keep::kValues);
  std::string buf(size_t{1} << 20, '\0');
  while (true) {
    const size_t got = std::fread(buf.data(), 1, buf.size(), file.get());
    KILN_RETURN_IF_ERROR(check.Consume(std::string_view(buf.data(), got)));
    if (got < buf.size()) break;
  }
  if (std::ferror(file.get())) return absl::DataLossError(absl::StrCat(path, ": read error"));
  KILN_RETURN_IF_ERROR(check.Finish());
  return DatasetOf(check);
}

// Moves the last `n` samples of `from` into a new dataset.
Dataset SplitTail(Dataset* from, int64_t n) {
  const int64_t f = from->sample_elems();
  const int64_t keep = from->size - n;
  Dataset tail;
  tail.sample_shape = from->sample_shape;
  tail.size = n;
  tail.features.assign(from->features.begin() + keep * f, from->features.end());
  tail.labels.assign(from->labels.begin() + keep, from->labels.end());
  from->features.resize(keep * f);
  from->labels.resize(keep);
  from->size = keep;
  tail.num_classes = from->num_classes;
  return tail;
}

}  // namespace

absl::StatusOr<DatasetSplits> LoadCsvFolder(const std::string& dir, const CsvOptions& options) {
  if (!(options.test_fraction >= 0.0 && options.test_fraction < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("test_fraction must be in [0, 1), got ", options.test_fraction));
  }
  const std::string train_path = (fs::path(dir) / kCsvTrainFile).string();
  const std::string test_path = (fs::path(dir) / kCsvTestFile).string();
  std::error_code ec;
  if (!fs::is_regular_file(train_path, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": no ", kCsvTrainFile));
  }
  DatasetSplits splits;
  KILN_ASSIGN_OR_RETURN(splits.train, ReadCsvFile(train_path, options));
  if (fs::is_regular_file(test_path, ec)) {
    KILN_ASSIGN_OR_RETURN(splits.test, ReadCsvFile(test_path, options));
    if (splits.test.sample_shape != splits.train.sample_shape) {
      return absl::InvalidArgumentError(absl::StrCat(test_path, ": ", splits.test.sample_shape[0],
                                                     " feature columns but ", train_path, " has ",
                                                     splits.train.sample_shape[0]));
    }
  } else if (options.test_fraction > 0) {
    const auto n = static_cast<int64_t>(std::floor(splits.train.size * options.test_fraction));
    if (n < 1 || n >= splits.train.size) {
      return absl::InvalidArgumentError(
          absl::StrCat(train_path, ": a test fraction of ", options.test_fraction, " of ",
                       splits.train.size, " rows leaves an empty split"));
    }
    splits.test = SplitTail(&splits.train, n);
  } else {
    splits.test.sample_shape = splits.train.sample_shape;
  }
  const int32_t classes = std::max(splits.train.num_classes, splits.test.num_classes);
  splits.train.num_classes = splits.test.num_classes = classes;
  return splits;
}

PixelNorm FeatureStandardisation(const Dataset& train) {
  PixelNorm norm(1.0f, 0.0f, 1.0f);
  const int64_t f = train.sample_elems();
  if (!train.has_features() || train.size == 0 || f == 0) return norm;
  std::vector<double> sum(f, 0.0), sq(f, 0.0);
  for (int64_t r = 0; r < train.size; ++r) {
    for (int64_t j = 0; j < f; ++j) sum[j] += train.features[r * f + j];
  }
  for (int64_t j = 0; j < f; ++j) sum[j] /= static_cast<double>(train.size);
  for (int64_t r = 0; r < train.size; ++r) {
    for (int64_t j = 0; j < f; ++j) {
      const double d = train.features[r * f + j] - sum[j];
      sq[j] += d * d;
    }
  }
  for (int64_t j = 0; j < f; ++j) {
    const double std = std::sqrt(sq[j] / static_cast<double>(train.size));
    norm.channel_mean.push_back(static_cast<float>(sum[j]));
    norm.channel_std.push_back(std > 1e-12 ? static_cast<float>(std) : 1.0f);
  }
  norm.input = NormInput::kFeatures;
  return norm;
}

}  // namespace kiln
