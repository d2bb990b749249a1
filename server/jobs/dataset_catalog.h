// The named datasets under --data_dir: folders of MNIST-style IDX files, listed, inspected,
// loaded for training, and created by verified uploads.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/atomic_file.h"
#include "common/sha256.h"
#include "engine/data/dataset.h"
#include "kiln/v1/training.pb.h"

namespace kiln::server {

// What a submission needs to know about a dataset, read from file headers and the labels.
struct DatasetInfo {
  Shape sample_shape;
  int64_t train_samples = 0;
  int64_t test_samples = 0;
  int32_t num_classes = 0;  // 1 + the largest label of either split
};

class DatasetUpload;

// Thread-safe: it keeps no state but the folder.
class DatasetCatalog {
 public:
  DatasetCatalog(std::string data_dir, int64_t max_upload_bytes)
      : data_dir_(std::move(data_dir)), max_upload_bytes_(max_upload_bytes) {}

  // Every dataset folder, by name. Folders that are not datasets are left out.
  absl::StatusOr<std::vector<v1::Dataset>> List() const;
  // NotFound when there is no such dataset; the reason when it is unreadable.
  absl::StatusOr<v1::Dataset> Describe(const std::string& name) const;
  absl::StatusOr<DatasetInfo> Inspect(const std::string& name) const;
  // Loads both splits into memory.
  absl::StatusOr<DatasetSplits> Load(const std::string& name) const;
  // Starts an upload of a new dataset; AlreadyExists when the name is taken. The upload is
  // written into a folder .upload-<pid>-<hex>-<name> and renamed into place when it is complete.
  absl::StatusOr<std::unique_ptr<DatasetUpload>> BeginUpload(const std::string& name) const;
  // The pid in the name of such an upload folder, or -1 when `dir_name` is not one.
  static int UploadWriterPid(const std::string& dir_name);

  const std::string& data_dir() const { return data_dir_; }
  int64_t max_upload_bytes() const { return max_upload_bytes_; }

 private:
  std::string PathOf(const std::string& name) const { return data_dir_ + "/" + name; }

  std::string data_dir_;
  int64_t max_upload_bytes_;
};

// One upload in progress, written to a hidden temporary folder and moved into place by Commit.
// Abandoned uploads leave nothing behind. Not thread-safe (one stream feeds it).
class DatasetUpload {
 public:
  ~DatasetUpload();
  DatasetUpload(const DatasetUpload&) = delete;
  DatasetUpload& operator=(const DatasetUpload&) = delete;

  // Appends a chunk: checks the file name, that files do not interleave or repeat, the size
  // limit (ResourceExhausted), and on a file's last chunk (sha256 set) its digest (DataLoss).
  absl::Status Append(const v1::DatasetFileChunk& chunk);
  // Checks every file was finished, loads the dataset to validate it, and publishes it.
  absl::StatusOr<v1::Dataset> Commit();

 private:
  friend class DatasetCatalog;
  DatasetUpload(const DatasetCatalog* catalog, std::string name, std::string temp_dir);
  absl::Status FinishFile(const std::string& expected_sha256);

  const DatasetCatalog* catalog_;
  std::string name_;
  std::string temp_dir_;
  bool committed_ = false;
  int64_t total_bytes_ = 0;
  std::set<std::string> finished_files_;
  std::string current_file_;                // empty between files
  std::unique_ptr<AtomicFileWriter> file_;  // the file being received
  std::unique_ptr<Sha256> sha_;
};

}  // namespace kiln::server
