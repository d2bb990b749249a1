#include "engine/data/cifar10_reader.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <new>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "engine/data/data_file.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kTrainPrefix = "data_batch_";
constexpr std::string_view kSuffix = ".bin";

}  // namespace

int Cifar10TrainFileNumber(std::string_view file_name) {
  if (file_name.size() <= kTrainPrefix.size() + kSuffix.size() ||
      file_name.substr(0, kTrainPrefix.size()) != kTrainPrefix ||
      file_name.substr(file_name.size() - kSuffix.size()) != kSuffix) {
    return 0;
  }
  const std::string_view digits = file_name.substr(
      kTrainPrefix.size(), file_name.size() - kTrainPrefix.size() - kSuffix.size());
  if (digits.size() > 2 || digits[0] == '0') return 0;
  int n = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return 0;
    n = n * 10 + (c - '0');
  }
  return n <= kCifar10MaxTrainFiles ? n : 0;
}

absl::Status Cifar10StreamCheck::Consume(std::string_view bytes) {
  // Offsets of the label bytes in this piece: every kCifar10RecordBytes from the next record.
  int64_t skip = (kCifar10RecordBytes - bytes_ % kCifar10RecordBytes) % kCifar10RecordBytes;
  for (int64_t i = skip; i < static_cast<int64_t>(bytes.size()); i += kCifar10RecordBytes) {
    const int label = static_cast<uint8_t>(bytes[i]);
    const int64_t offset = bytes_ + i;
    if (offset == 0) first_byte_ = static_cast<uint8_t>(label);
    if (label >= kCifar10Classes) {
      const bool gzip = offset == 0 && bytes.size() >= 2 && label == 0x1f &&
                        static_cast<uint8_t>(bytes[1]) == 0x8b;
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: record %d at byte offset %d has label %d; CIFAR-10 labels are 0..9%s", name_,
          offset / kCifar10RecordBytes, offset, label,
          gzip ? " (the file looks gzip-compressed: send the decompressed .bin)" : ""));
    }
    max_label_ = std::max(max_label_, label);
  }
  bytes_ += static_cast<int64_t>(bytes.size());
  return absl::OkStatus();
}

absl::Status Cifar10StreamCheck::Finish() const {
  if (bytes_ == 0) {
    return absl::DataLossError(absl::StrCat(name_, ": empty: a CIFAR-10 batch holds ",
                                            kCifar10RecordBytes, "-byte records"));
  }
  const int64_t partial = bytes_ % kCifar10RecordBytes;
  if (partial != 0) {
    const int64_t offset = bytes_ - partial;
    return absl::DataLossError(absl::StrFormat(
        "%s: truncated: the record at byte offset %d (record %d) has %d of its %d bytes; the file "
        "is %d bytes, not a whole number of %d-byte records (1 label byte + 3x32x32 pixels)",
        name_, offset, offset / kCifar10RecordBytes, partial, kCifar10RecordBytes, bytes_,
        kCifar10RecordBytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<Dataset> ParseCifar10(std::string_view bytes, const std::string& name) {
  Cifar10StreamCheck check(name);
  KILN_RETURN_IF_ERROR(check.Consume(bytes));
  KILN_RETURN_IF_ERROR(check.Finish());
  Dataset ds;
  ds.sample_shape = {3, 32, 32};
  ds.size = check.records();
  ds.num_classes = check.max_label() + 1;
  try {
    ds.pixels.resize(static_cast<size_t>(ds.size * kCifar10ImageBytes));
    ds.labels.resize(static_cast<size_t>(ds.size));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(name, ": out of memory holding ", ds.size, " CIFAR-10 images"));
  }
  for (int64_t r = 0; r < ds.size; ++r) {
    const char* record = bytes.data() + r * kCifar10RecordBytes;
    ds.labels[r] = static_cast<uint8_t>(record[0]);
    std::memcpy(ds.pixels.data() + r * kCifar10ImageBytes, record + 1, kCifar10ImageBytes);
  }
  return ds;
}

absl::StatusOr<Dataset> ReadCifar10File(const std::string& path, int64_t max_bytes) {
  KILN_ASSIGN_OR_RETURN(std::string bytes, ReadDataFile(path, "a CIFAR-10 batch file", max_bytes));
  if (static_cast<int64_t>(bytes.size()) > max_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: too large: more than %d bytes (%d records), the most one CIFAR-10 batch file may hold",
        path, max_bytes, max_bytes / kCifar10RecordBytes));
  }
  return ParseCifar10(bytes, path);
}

absl::StatusOr<Dataset> ReadCifar10Files(const std::vector<std::string>& paths, int64_t max_bytes) {
  if (paths.empty()) return absl::InvalidArgumentError("no CIFAR-10 batch files given");
  Dataset out;
  for (size_t i = 0; i < paths.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(Dataset part, ReadCifar10File(paths[i], max_bytes));
    if (i == 0) {
      out = std::move(part);
      continue;
    }
    try {
      out.pixels.insert(out.pixels.end(), part.pixels.begin(), part.pixels.end());
      out.labels.insert(out.labels.end(), part.labels.begin(), part.labels.end());
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(
          absl::StrCat(paths[i], ": out of memory joining it to the batches before it"));
    }
    out.size += part.size;
    out.num_classes = std::max(out.num_classes, part.num_classes);
  }
  return out;
}

std::vector<std::string> FindCifar10TrainFiles(const std::string& dir) {
  std::map<int, std::string> by_number;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const int n = Cifar10TrainFileNumber(entry.path().filename().string());
    if (n > 0 && entry.is_regular_file(ec)) by_number[n] = entry.path().string();
  }
  std::vector<std::string> out;
  for (auto& [n, path] : by_number) out.push_back(std::move(path));
  return out;
}

absl::StatusOr<DatasetSplits> LoadCifar10Folder(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": dataset folder does not exist"));
  }
  const std::vector<std::string> train = FindCifar10TrainFiles(dir);
  if (train.empty()) {
    return absl::NotFoundError(
        absl::StrCat(dir, ": no CIFAR-10 training batch (data_batch_<N>.bin, N in 1..",
                     kCifar10MaxTrainFiles, ")"));
  }
  DatasetSplits splits;
  KILN_ASSIGN_OR_RETURN(splits.train, ReadCifar10Files(train));
  const std::string test = (fs::path(dir) / kCifar10TestFile).string();
  if (fs::is_regular_file(test, ec)) {
    KILN_ASSIGN_OR_RETURN(splits.test, ReadCifar10File(test));
  } else {
    splits.test.sample_shape = splits.train.sample_shape;
    splits.test.num_classes = splits.train.num_classes;
  }
  return splits;
}

}  // namespace kiln
