// An in-memory labelled image dataset: raw uint8 pixels plus int32 labels, loaded from IDX files
// or CIFAR-10 batches.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tensor.h"

namespace kiln {

struct Dataset {
  Shape sample_shape;           // e.g. {28, 28} as stored; models see {1, 28, 28} or {784}
  int64_t size = 0;             // number of samples
  std::vector<uint8_t> pixels;  // size * NumElements(sample_shape), sample-major
  // Float datasets (CSV tables) hold their samples here instead, pixels left empty.
  std::vector<float> features;
  std::vector<int32_t> labels;  // size
  int32_t num_classes = 0;      // 1 + the largest label

  int64_t sample_elems() const { return NumElements(sample_shape); }
  bool has_features() const { return !features.empty(); }
};

// A train/test pair as laid out in a dataset folder.
struct DatasetSplits {
  Dataset train;
  Dataset test;  // size 0 when the folder has no test files
};

// How a dataset folder's files are laid out.
enum class DatasetFormat {
  kIdx,      // MNIST-style IDX files (LoadImageFolder)
  kCifar10,  // CIFAR-10 binary batches (LoadCifar10Folder, engine/data/cifar10_reader.h)
  kCsv,      // train.csv (and test.csv): LoadCsvFolder, engine/data/csv_reader.h
  kNpy,      // train_x.npy, train_y.npy (and test_*): LoadNpyFolder, engine/data/npy_reader.h
  // Token datasets, never loaded into memory: OpenTokenDataset (engine/data/token_data.h).
  kText,    // train_000.bin, val_000.bin and vocab.json, encoded from a text corpus
  kTokens,  // llm.c shards train_NNN.bin (and val_NNN.bin); the job's model gives the vocabulary
};

// Whether a dataset of `format` holds tokens (opened by OpenTokenDataset) rather than samples.
bool IsTokenFormat(DatasetFormat format);

// "idx", "cifar10", "csv", "npy", "text", "tokens": the names the CLI, the manifest and listings
// use.
std::string_view DatasetFormatName(DatasetFormat format);
std::optional<DatasetFormat> DatasetFormatFromName(std::string_view name);

// The format of a folder's files: CIFAR-10 when it holds a data_batch_<N>.bin, CSV when it holds
// train.csv, NPY when it holds train_x.npy, text when it holds vocab.json and train_NNN.bin,
// tokens when it holds train_NNN.bin alone, IDX otherwise.
DatasetFormat DetectDatasetFormat(const std::string& dir);

// Loads a dataset folder laid out in `format`; CSV folders with their default options. Token
// formats are InvalidArgument: they are opened, not loaded.
absl::StatusOr<DatasetSplits> LoadDatasetFolder(const std::string& dir, DatasetFormat format);

// Loads a folder holding MNIST-style files: train-images-idx3-ubyte, train-labels-idx1-ubyte,
// t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, each raw or gzip-compressed (".gz"), as
// fetch-mnist writes them and Debian's dataset-fashion-mnist ships them (in
// /usr/share/datasets/fashion-mnist). Missing train files are NotFound; a folder with neither
// test file gives an empty test split. Errors name the file and the problem.
absl::StatusOr<DatasetSplits> LoadImageFolder(const std::string& dir);

// Loads one images file and its labels file, checking that their counts agree.
absl::StatusOr<Dataset> LoadImagesAndLabels(const std::string& images_path,
                                            const std::string& labels_path);

}  // namespace kiln
