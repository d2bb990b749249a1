// The named datasets under --data_dir: folders of MNIST-style IDX files, CIFAR-10 batches, CSV
// tables, NumPy arrays or token shards (from a text corpus or as llm.c wrote them); listed,
// inspected, loaded (samples) or opened (tokens) for training, created by verified uploads that
// publish only when complete, and deleted.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/atomic_file.h"
#include "common/sha256.h"
#include "engine/data/cifar10_reader.h"
#include "engine/data/csv_reader.h"
#include "engine/data/dataset.h"
#include "engine/data/npy_reader.h"
#include "engine/data/token_data.h"
#include "engine/data/utf8.h"
#include "kiln/v1/training.pb.h"
#include "server/datasets/dataset_manifest.h"
#include "server/datasets/gunzip_stream.h"
#include "server/datasets/idx_stream_facts.h"
#include "server/datasets/token_shard_stream_check.h"

namespace kiln::server {

class DatasetUpload;

// One data file of a dataset folder as the file system describes it.
struct DatasetFileStat {
  std::string name;
  int64_t size_bytes = 0;
  int64_t mtime_ns = 0;
};

// Thread-safe. Dataset facts come from each folder's manifest, or for folders placed by hand,
// from reading their files once (cached by file names, sizes and modification times).
class DatasetCatalog {
 public:
  // `max_upload_bytes` bounds an upload's bytes after decompression.
  DatasetCatalog(std::string data_dir, int64_t max_upload_bytes)
      : data_dir_(std::move(data_dir)), max_upload_bytes_(max_upload_bytes) {}

  // Every dataset folder, by name. Folders that are not datasets are left out.
  absl::StatusOr<std::vector<v1::Dataset>> List() const;
  // NotFound when there is no such dataset; the reason when it is unreadable.
  absl::StatusOr<v1::Dataset> Describe(const std::string& name) const;
  absl::StatusOr<DatasetInfo> Inspect(const std::string& name) const;
  // Who uploaded it (Dataset.owner; empty for a folder placed by hand or none at all).
  v1::Owner OwnerOf(const std::string& name) const;
  // The NotFound a lookup of a dataset that is not there answers (also one another team owns).
  absl::Status NotFound(const std::string& name) const;
  // Whether a dataset folder of that name is there (its files are not read).
  bool Exists(const std::string& name) const;
  // Loads both splits into memory. InvalidArgument for a token dataset (OpenTokens opens those).
  absl::StatusOr<DatasetSplits> Load(const std::string& name) const;
  // Maps a token dataset's shards (text or tokens format; nothing is copied). InvalidArgument
  // for a dataset of samples.
  absl::StatusOr<TokenDataset> OpenTokens(const std::string& name) const;
  // Starts an upload of a new dataset; AlreadyExists when the name is taken. `declared_files`
  // (may be empty) are the files the client says it will send: the upload is then published
  // only if each of them arrived. The upload is written into a folder
  // .upload-<pid>-<hex>-<name> and renamed into place when it is complete.
  // `format` decides which file names are accepted and how each file is checked; `val_fraction`
  // (kText only, in (0, 0.5]) is the share of the corpus's end kept for validation.
  absl::StatusOr<std::unique_ptr<DatasetUpload>> BeginUpload(
      const std::string& name, const std::vector<std::string>& declared_files,
      DatasetFormat format = DatasetFormat::kIdx, const CsvOptions& csv = CsvOptions(),
      double val_fraction = kDefaultValFraction) const;
  // Removes a dataset: one rename takes it out of sight (to .deleting-<pid>-<hex>-<name>), then
  // its files go. NotFound when there is none. Whether jobs still need it is the caller's check.
  absl::Status Delete(const std::string& name);
  // The pid in the name of an upload or deletion folder, or -1 when `dir_name` is not one.
  static int TempFolderWriterPid(const std::string& dir_name);

  const std::string& data_dir() const { return data_dir_; }
  int64_t max_upload_bytes() const { return max_upload_bytes_; }

 private:
  struct CachedFacts {
    std::string signature;  // names, sizes and mtimes of the files the facts were read from
    DatasetInfo info;
  };

  std::string PathOf(const std::string& name) const { return data_dir_ + "/" + name; }
  absl::Status CheckFolder(const std::string& name) const;
  // The facts of a dataset whose data files are `files` (its manifest, the cache, or the files).
  absl::StatusOr<DatasetInfo> Facts(const std::string& name,
                                    const std::vector<DatasetFileStat>& files) const;

  std::string data_dir_;
  int64_t max_upload_bytes_;
  mutable std::mutex cache_mu_;
  mutable std::map<std::string, CachedFacts> cache_;  // by dataset name; guarded by cache_mu_
};

// One upload in progress, written to a hidden temporary folder and moved into place by Commit.
// Each file is checked as it streams in: inflated (when gzip) in bounded pieces, its
// decompressed bytes counted against the limit and checked as IDX (CIFAR-10 batches: record by
// record, uncompressed; token shards: header and length; text: UTF-8). A text corpus is stored
// aside in the folder's .corpus/ and encoded into shards and vocab.json by Commit, which then
// removes the text. Abandoned uploads leave nothing behind. Not thread-safe (one stream feeds it).
class DatasetUpload {
 public:
  ~DatasetUpload();
  DatasetUpload(const DatasetUpload&) = delete;
  DatasetUpload& operator=(const DatasetUpload&) = delete;

  // Appends a chunk: checks the file name, that files do not interleave or repeat, the size
  // limit after decompression (ResourceExhausted, as soon as it is passed), the IDX format, and
  // on a file's last chunk (sha256 set) its digest (DataLoss).
  absl::Status Append(const v1::DatasetFileChunk& chunk);
  // Checks every expected file was finished and the files agree, writes the dataset's manifest,
  // and publishes the folder under its name with one rename that never replaces anything.
  absl::StatusOr<v1::Dataset> Commit();
  // Bytes received so far, as stored (compressed files count compressed).
  int64_t stored_bytes() const { return stored_bytes_; }
  // Who uploads it (Dataset.owner), written beside its files by Commit.
  void set_owner(v1::Owner owner) { owner_ = std::move(owner); }

 private:
  friend class DatasetCatalog;
  // What one finished file turned out to hold.
  struct FileFacts {
    std::string file_name;  // as uploaded, e.g. "train-images-idx3-ubyte.gz"
    std::vector<int64_t> dims;
    int max_element = -1;
    char kind = 0;  // NPY: 'u' (uint8), 'f' (float32) or 'i' (integers)
    int64_t stored_bytes = 0;
  };
  // The file being received.
  struct FileInProgress {
    std::string file_name;
    std::unique_ptr<AtomicFileWriter> writer;
    Sha256 sha;
    std::string first_bytes;                       // until two decide raw or gzip
    std::unique_ptr<GunzipStream> gunzip;          // set once gzip is detected
    std::unique_ptr<IdxStreamFacts> facts;         // IDX: set once raw or gzip is decided
    std::unique_ptr<Cifar10StreamCheck> cifar;     // CIFAR-10: set with the file
    std::unique_ptr<CsvStreamCheck> csv;           // CSV: set with the file
    std::unique_ptr<NpyStreamCheck> npy;           // NPY: set with the file
    std::unique_ptr<TokenShardStreamCheck> shard;  // tokens: set with the file
    std::unique_ptr<Utf8StreamCheck> text;         // text: set with the file
    int64_t stored_bytes = 0;
  };

  DatasetUpload(const DatasetCatalog* catalog, std::string name, std::string temp_dir,
                std::set<std::string> declared_files, DatasetFormat format, CsvOptions csv,
                double val_fraction);
  // Where a file being uploaded is written: a text corpus's files aside in .corpus/.
  std::string StoredPath(const std::string& file) const;
  // Passes stored bytes on to the IDX check, inflating them when the file is gzip.
  absl::Status Scan(absl::string_view stored);
  // Counts decompressed bytes against the limit, then checks them as IDX.
  absl::Status CountAndCheck(absl::string_view decompressed);
  absl::Status FinishFile(const std::string& expected_sha256);
  // The dataset's facts from its finished files; InvalidArgument naming what is missing or
  // does not agree.
  absl::StatusOr<DatasetInfo> CheckComplete() const;
  absl::StatusOr<DatasetInfo> CheckCompleteCifar10() const;
  absl::StatusOr<DatasetInfo> CheckCompleteCsv() const;
  absl::StatusOr<DatasetInfo> CheckCompleteNpy() const;
  absl::StatusOr<DatasetInfo> CheckCompleteTokens() const;
  // kText: encodes the corpus (in the order its files came) into shards and vocab.json, then
  // removes the text; InvalidArgument naming the file for text that is not UTF-8 or empty.
  absl::StatusOr<DatasetInfo> EncodeText();

  const DatasetCatalog* catalog_;
  std::string name_;
  std::string temp_dir_;
  std::set<std::string> declared_files_;  // empty: the client declared none
  DatasetFormat format_;
  CsvOptions csv_;
  double val_fraction_;
  v1::Owner owner_;
  std::vector<std::string> text_order_;  // kText: the corpus's files as they came
  bool committed_ = false;
  int64_t stored_bytes_ = 0;
  int64_t decompressed_bytes_ = 0;
  std::map<std::string, FileFacts> finished_;  // by base name (without ".gz")
  std::unique_ptr<FileInProgress> current_;    // null between files
};

}  // namespace kiln::server
