// A dataset's facts (format, sample or token counts, sample shape, class count or vocabulary),
// computed once when its upload is committed and kept beside its files in .kiln-dataset.json, so
// that listing datasets reads one small file instead of inflating every label file again.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "engine/data/csv_reader.h"
#include "engine/data/dataset.h"

namespace kiln::server {

inline constexpr char kDatasetManifestName[] = ".kiln-dataset.json";

// What a submission needs to know about a dataset, read from file headers and the labels.
struct DatasetInfo {
  Shape sample_shape;
  int64_t train_samples = 0;
  int64_t test_samples = 0;
  int32_t num_classes = 0;  // 1 + the largest label of either split
  DatasetFormat format = DatasetFormat::kIdx;
  CsvOptions csv;  // kCsv: how its tables are read
  // kText and kTokens (whose sample counts are 0): tokens per split, the text vocabulary's size
  // (0 for kTokens: the job's model says) and the largest token of either split.
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  int32_t vocab_size = 0;
  int32_t max_token = -1;
};

// The data files of a dataset folder and their sizes in bytes, by file name.
using DatasetFileSizes = std::map<std::string, int64_t>;

// Writes the manifest into `dir` atomically; `files` are the data files it describes.
absl::Status WriteDatasetManifest(const std::string& dir, const DatasetInfo& info,
                                  const DatasetFileSizes& files);

// The manifest's facts; nullopt when there is none, it cannot be read, or the files it describes
// are not exactly `files` (the folder was changed by hand since).
std::optional<DatasetInfo> ReadDatasetManifest(const std::string& dir,
                                               const DatasetFileSizes& files);

}  // namespace kiln::server
