// A reader for CIFAR-10's binary format: records of one label byte (0..9) then 3072 bytes of a
// 32x32 RGB image, stored channel by channel (1024 red, 1024 green, 1024 blue), no header.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/data/dataset.h"

namespace kiln {

inline constexpr int64_t kCifar10ImageBytes = 3 * 32 * 32;
inline constexpr int64_t kCifar10RecordBytes = 1 + kCifar10ImageBytes;
inline constexpr int kCifar10Classes = 10;
// The largest batch file read: 2^20 records (3 GiB), a hundred times the official batches.
inline constexpr int64_t kCifar10MaxFileBytes = kCifar10RecordBytes << 20;
// Train batches are data_batch_<N>.bin with N in 1..kCifar10MaxTrainFiles; the test one is
// test_batch.bin (the names CIFAR-10's own archive uses).
inline constexpr int kCifar10MaxTrainFiles = 64;
inline constexpr char kCifar10TestFile[] = "test_batch.bin";

// The number N of a train batch name data_batch_<N>.bin (1..kCifar10MaxTrainFiles, no leading
// zero), or 0 when `file_name` is not one.
int Cifar10TrainFileNumber(std::string_view file_name);

// Checks CIFAR-10 records as their bytes stream past in pieces of any size: every label byte is
// 0..9 and the bytes make whole records. Keeps only counts. Not thread-safe.
class Cifar10StreamCheck {
 public:
  // `name` prefixes every error (a file name).
  explicit Cifar10StreamCheck(std::string name) : name_(std::move(name)) {}

  // The next bytes. A label out of range is InvalidArgument naming the record and byte offset.
  absl::Status Consume(std::string_view bytes);
  // DataLoss when the bytes end inside a record (naming its offset) or hold no record at all.
  absl::Status Finish() const;

  int64_t records() const { return bytes_ / kCifar10RecordBytes; }
  // The largest label seen; -1 before the first record.
  int max_label() const { return max_label_; }

 private:
  std::string name_;
  int64_t bytes_ = 0;
  int max_label_ = -1;
  uint8_t first_byte_ = 0;
};

// Parses CIFAR-10 records already in memory into a dataset of sample shape {3, 32, 32} (CHW, as
// stored); `name` is used in errors in place of a path.
absl::StatusOr<Dataset> ParseCifar10(std::string_view bytes, const std::string& name);

// Reads one batch file with ParseCifar10's checks. Errors: NotFound, PermissionDenied,
// InvalidArgument (a bad label, a file over `max_bytes`), DataLoss (truncated: the offset of the
// cut record). Each names the path. Never throws.
absl::StatusOr<Dataset> ReadCifar10File(const std::string& path,
                                        int64_t max_bytes = kCifar10MaxFileBytes);

// Reads several batch files, in order, into one split.
absl::StatusOr<Dataset> ReadCifar10Files(const std::vector<std::string>& paths,
                                         int64_t max_bytes = kCifar10MaxFileBytes);

// The train batch files of `dir` (data_batch_<N>.bin), ordered by N; empty when none.
std::vector<std::string> FindCifar10TrainFiles(const std::string& dir);

// Loads a folder of CIFAR-10 batches: every data_batch_<N>.bin as the train split, in order of
// N, and test_batch.bin (optional) as the test split. NotFound without a train batch.
absl::StatusOr<DatasetSplits> LoadCifar10Folder(const std::string& dir);

}  // namespace kiln
