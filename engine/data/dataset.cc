#include "engine/data/dataset.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "engine/data/cifar10_reader.h"
#include "engine/data/csv_reader.h"
#include "engine/data/idx_reader.h"
#include "engine/data/npy_reader.h"
#include "engine/data/token_data.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr char kTrainImages[] = "train-images-idx3-ubyte";
constexpr char kTrainLabels[] = "train-labels-idx1-ubyte";
constexpr char kTestImages[] = "t10k-images-idx3-ubyte";
constexpr char kTestLabels[] = "t10k-labels-idx1-ubyte";

// The path of `base` or `base`.gz in dir, the raw file first since it needs no inflating.
std::optional<std::string> FindIdxFile(const std::string& dir, const std::string& base) {
  for (const std::string& name : {base, base + ".gz"}) {
    fs::path p = fs::path(dir) / name;
    std::error_code ec;
    if (fs::exists(p, ec) && !fs::is_directory(p, ec)) return p.string();
  }
  return std::nullopt;
}

}  // namespace

std::string_view DatasetFormatName(DatasetFormat format) {
  switch (format) {
    case DatasetFormat::kIdx:
      return "idx";
    case DatasetFormat::kCifar10:
      return "cifar10";
    case DatasetFormat::kCsv:
      return "csv";
    case DatasetFormat::kNpy:
      return "npy";
    case DatasetFormat::kText:
      return "text";
    case DatasetFormat::kTokens:
      return "tokens";
  }
  return "unknown";
}

std::optional<DatasetFormat> DatasetFormatFromName(std::string_view name) {
  for (DatasetFormat f : {DatasetFormat::kIdx, DatasetFormat::kCifar10, DatasetFormat::kCsv,
                          DatasetFormat::kNpy, DatasetFormat::kText, DatasetFormat::kTokens}) {
    if (name == DatasetFormatName(f)) return f;
  }
  return std::nullopt;
}

bool IsTokenFormat(DatasetFormat format) {
  return format == DatasetFormat::kText || format == DatasetFormat::kTokens;
}

DatasetFormat DetectDatasetFormat(const std::string& dir) {
  if (!FindCifar10TrainFiles(dir).empty()) return DatasetFormat::kCifar10;
  std::error_code ec;
  if (fs::is_regular_file(fs::path(dir) / kCsvTrainFile, ec)) return DatasetFormat::kCsv;
  if (fs::is_regular_file(fs::path(dir) / kNpyTrainX, ec)) return DatasetFormat::kNpy;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (TokenShardNumber(entry.path().filename().string(), kTokenTrainPrefix) >= 0) {
      return fs::is_regular_file(fs::path(dir) / kVocabularyFile, ec) ? DatasetFormat::kText
                                                                      : DatasetFormat::kTokens;
    }
  }
  return DatasetFormat::kIdx;
}

absl::StatusOr<DatasetSplits> LoadDatasetFolder(const std::string& dir, DatasetFormat format) {
  switch (format) {
    case DatasetFormat::kIdx:
      return LoadImageFolder(dir);
    case DatasetFormat::kCifar10:
      return LoadCifar10Folder(dir);
    case DatasetFormat::kCsv:
      return LoadCsvFolder(dir, CsvOptions());
    case DatasetFormat::kNpy:
      return LoadNpyFolder(dir);
    case DatasetFormat::kText:
    case DatasetFormat::kTokens:
      return absl::InvalidArgumentError(
          absl::StrCat(dir, ": holds ", std::string(DatasetFormatName(format)),
                       " (token shards): a language model's data, opened with OpenTokenDataset, "
                       "not loaded as samples"));
  }
  return absl::InvalidArgumentError(absl::StrCat(dir, ": unknown dataset format"));
}

absl::StatusOr<Dataset> LoadImagesAndLabels(const std::string& images_path,
                                            const std::string& labels_path) {
  KILN_ASSIGN_OR_RETURN(IdxArray images, ReadIdxFile(images_path));
  if (images.dims.size() != 3) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: wrong rank for images: expected rank 3 (N x H x W) but the file has rank %d (%s)",
        images_path, images.dims.size(), absl::StrJoin(images.dims, "x")));
  }
  KILN_ASSIGN_OR_RETURN(IdxArray labels, ReadIdxFile(labels_path));
  if (labels.dims.size() != 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: wrong rank for labels: expected rank 1 (N) but the file has rank %d (%s)", labels_path,
        labels.dims.size(), absl::StrJoin(labels.dims, "x")));
  }
  if (images.dims[0] != labels.dims[0]) {
    return absl::InvalidArgumentError(
        absl::StrFormat("count mismatch: %s has %d images but %s has %d labels", images_path,
                        images.dims[0], labels_path, labels.dims[0]));
  }

  Dataset ds;
  ds.sample_shape = {images.dims[1], images.dims[2]};
  ds.size = images.dims[0];
  ds.pixels = std::move(images.data);
  // Labels are unsigned bytes, so each is < 256 by construction and num_classes <= 256.
  ds.labels.assign(labels.data.begin(), labels.data.end());
  ds.num_classes = 1 + *std::max_element(ds.labels.begin(), ds.labels.end());
  return ds;
}

absl::StatusOr<DatasetSplits> LoadImageFolder(const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (st.type() == fs::file_type::not_found) {
    return absl::NotFoundError(absl::StrCat(dir, ": dataset folder does not exist"));
  }
  if (!fs::is_directory(st)) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": not a folder; expected a dataset ", "folder holding IDX files"));
  }

  const std::optional<std::string> train_images = FindIdxFile(dir, kTrainImages);
  const std::optional<std::string> train_labels = FindIdxFile(dir, kTrainLabels);
  if (!train_images || !train_labels) {
    std::vector<std::string> missing;
    if (!train_images) missing.emplace_back(kTrainImages);
    if (!train_labels) missing.emplace_back(kTrainLabels);
    return absl::NotFoundError(absl::StrFormat(
        "%s: missing training files: expected %s and %s (each raw or with .gz); not found: %s", dir,
        kTrainImages, kTrainLabels, absl::StrJoin(missing, ", ")));
  }

  DatasetSplits splits;
  KILN_ASSIGN_OR_RETURN(splits.train, LoadImagesAndLabels(*train_images, *train_labels));

  const std::optional<std::string> test_images = FindIdxFile(dir, kTestImages);
  const std::optional<std::string> test_labels = FindIdxFile(dir, kTestLabels);
  if (!test_images && !test_labels) {
    // No test split is allowed; give the empty one the train shape so callers need no special case.
    splits.test.sample_shape = splits.train.sample_shape;
    splits.test.num_classes = splits.train.num_classes;
    return splits;
  }
  // Half a test pair is a broken download rather than a folder without a test split.
  if (!test_images || !test_labels) {
    return absl::NotFoundError(absl::StrFormat(
        "%s: incomplete test files: found %s but not %s (raw or with .gz)", dir,
        test_images ? *test_images : *test_labels, test_images ? kTestLabels : kTestImages));
  }
  KILN_ASSIGN_OR_RETURN(splits.test, LoadImagesAndLabels(*test_images, *test_labels));
  if (splits.test.sample_shape != splits.train.sample_shape) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sample shape mismatch: %s has %s images but %s has %s", *train_images,
                        absl::StrJoin(splits.train.sample_shape, "x"), *test_images,
                        absl::StrJoin(splits.test.sample_shape, "x")));
  }
  return splits;
}

}  // namespace kiln
