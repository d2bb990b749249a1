#include "server/jobs/dataset_catalog.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <random>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "engine/data/idx_reader.h"
#include "server/jobs/spec_translation.h"

namespace kiln::server {
namespace fs = std::filesystem;
namespace {

constexpr const char* kTrainImages = "train-images-idx3-ubyte";
constexpr const char* kTrainLabels = "train-labels-idx1-ubyte";
constexpr const char* kTestImages = "t10k-images-idx3-ubyte";
constexpr const char* kTestLabels = "t10k-labels-idx1-ubyte";

// The file of `base` in `dir`, raw or gzipped; empty when neither exists.
std::string FindFile(const std::string& dir, const std::string& base) {
  for (const std::string& name : {base, base + ".gz"}) {
    std::error_code ec;
    if (fs::is_regular_file(dir + "/" + name, ec)) return dir + "/" + name;
  }
  return "";
}

bool IsUploadFileName(const std::string& name) {
  for (const char* base : {kTrainImages, kTrainLabels, kTestImages, kTestLabels}) {
    if (name == base || name == absl::StrCat(base, ".gz")) return true;
  }
  return false;
}

constexpr char kUploadPrefix[] = ".upload-";

std::string RandomSuffix() {
  std::random_device rd;
  return absl::StrCat(absl::Hex(rd(), absl::kZeroPad8));
}

}  // namespace

absl::StatusOr<DatasetInfo> DatasetCatalog::Inspect(const std::string& name) const {
  if (!IsValidName(name)) {
    return absl::InvalidArgumentError(absl::StrCat("dataset name \"", name, "\" is not valid"));
  }
  const std::string dir = PathOf(name);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("dataset \"", name, "\" not found in ", data_dir_));
  }
  const std::string images = FindFile(dir, kTrainImages);
  const std::string labels = FindFile(dir, kTrainLabels);
  if (images.empty() || labels.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("dataset \"", name, "\" lacks ", kTrainImages,
                                                      " or ", kTrainLabels, " (raw or .gz)"));
  }
  DatasetInfo info;
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> dims, ReadIdxFileDims(images));
  if (dims.size() < 2) {
    return absl::FailedPreconditionError(absl::StrCat(images, ": images need rank 3 (N x H x W)"));
  }
  info.train_samples = dims[0];
  info.sample_shape.assign(dims.begin() + 1, dims.end());
  // The labels are small (one byte a sample); reading both splits' gives the class count the
  // model must cover.
  std::vector<std::string> label_files = {labels};
  const std::string test_images = FindFile(dir, kTestImages);
  if (!test_images.empty()) {
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> test_dims, ReadIdxFileDims(test_images));
    info.test_samples = test_dims.empty() ? 0 : test_dims[0];
    const std::string test_labels = FindFile(dir, kTestLabels);
    if (!test_labels.empty()) label_files.push_back(test_labels);
  }
  for (const std::string& file : label_files) {
    KILN_ASSIGN_OR_RETURN(IdxArray label_array, ReadIdxFile(file));
    for (uint8_t label : label_array.data) {
      info.num_classes = std::max<int32_t>(info.num_classes, label + 1);
    }
  }
  return info;
}

absl::StatusOr<v1::Dataset> DatasetCatalog::Describe(const std::string& name) const {
  KILN_ASSIGN_OR_RETURN(DatasetInfo info, Inspect(name));
  v1::Dataset d;
  d.set_name(name);
  d.set_train_samples(info.train_samples);
  d.set_test_samples(info.test_samples);
  for (int64_t dim : info.sample_shape) d.add_sample_shape(dim);
  std::vector<std::string> files;
  int64_t bytes = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(PathOf(name), ec)) {
    if (!entry.is_regular_file(ec)) continue;
    files.push_back(entry.path().filename().string());
    bytes += static_cast<int64_t>(entry.file_size(ec));
  }
  std::sort(files.begin(), files.end());
  for (const std::string& f : files) d.add_files(f);
  d.set_size_bytes(bytes);
  return d;
}

absl::StatusOr<std::vector<v1::Dataset>> DatasetCatalog::List() const {
  std::vector<v1::Dataset> out;
  std::error_code ec;
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(data_dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory(ec) && IsValidName(name)) names.push_back(name);
  }
  if (ec) return absl::UnavailableError(absl::StrCat(data_dir_, ": ", ec.message()));
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    absl::StatusOr<v1::Dataset> d = Describe(name);
    if (d.ok()) out.push_back(*std::move(d));
  }
  return out;
}

absl::StatusOr<DatasetSplits> DatasetCatalog::Load(const std::string& name) const {
  if (!IsValidName(name)) {
    return absl::InvalidArgumentError(absl::StrCat("dataset name \"", name, "\" is not valid"));
  }
  return LoadImageFolder(PathOf(name));
}

absl::StatusOr<std::unique_ptr<DatasetUpload>> DatasetCatalog::BeginUpload(
    const std::string& name) const {
  if (!IsValidName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("header.name: \"", name,
                     "\" is not valid (1-64 of A-Z a-z 0-9 . _ -, not starting with .)"));
  }
  std::error_code ec;
  if (fs::exists(PathOf(name), ec)) {
    return absl::AlreadyExistsError(absl::StrCat("dataset \"", name, "\" already exists"));
  }
  // The pid lets the next kilnd start tell an abandoned upload from a live one
  // (UploadWriterPid, server/jobs/interrupted_writes.h).
  const std::string temp =
      absl::StrCat(data_dir_, "/", kUploadPrefix, ::getpid(), "-", RandomSuffix(), "-", name);
  if (!fs::create_directories(temp, ec)) {
    return absl::UnavailableError(absl::StrCat("cannot create ", temp, ": ", ec.message()));
  }
  return std::unique_ptr<DatasetUpload>(new DatasetUpload(this, name, temp));
}

int DatasetCatalog::UploadWriterPid(const std::string& dir_name) {
  if (!absl::StartsWith(dir_name, kUploadPrefix)) return -1;
  const size_t begin = std::string_view(kUploadPrefix).size();
  const size_t dash = dir_name.find('-', begin);
  if (dash == std::string::npos) return -1;
  int pid = 0;
  if (!absl::SimpleAtoi(absl::string_view(dir_name).substr(begin, dash - begin), &pid) ||
      pid <= 0) {
    return -1;
  }
  return pid;
}

DatasetUpload::DatasetUpload(const DatasetCatalog* catalog, std::string name, std::string temp_dir)
    : catalog_(catalog), name_(std::move(name)), temp_dir_(std::move(temp_dir)) {}

DatasetUpload::~DatasetUpload() {
  file_.reset();  // removes an unfinished file's temp before the folder goes
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(temp_dir_, ec);
  }
}

absl::Status DatasetUpload::Append(const v1::DatasetFileChunk& chunk) {
  const std::string& file = chunk.file_name();
  if (!IsUploadFileName(file)) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.file_name: \"", file, "\" is not one of ", kTrainImages, ", ",
                     kTrainLabels, ", ", kTestImages, ", ", kTestLabels, " (optionally .gz)"));
  }
  if (file != current_file_) {
    if (!current_file_.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("chunk.file_name: \"", file,
                                                     "\" started before \"", current_file_,
                                                     "\" ended (its last chunk carries sha256)"));
    }
    if (finished_files_.count(file) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk.file_name: \"", file, "\" was already uploaded"));
    }
    KILN_ASSIGN_OR_RETURN(file_, AtomicFileWriter::Open(temp_dir_ + "/" + file));
    sha_ = std::make_unique<Sha256>();
    current_file_ = file;
  }
  total_bytes_ += static_cast<int64_t>(chunk.data().size());
  if (total_bytes_ > catalog_->max_upload_bytes()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("upload exceeds the limit of ", catalog_->max_upload_bytes(), " bytes"));
  }
  KILN_RETURN_IF_ERROR(file_->Append(chunk.data()));
  sha_->Update(chunk.data());
  if (!chunk.sha256().empty()) return FinishFile(chunk.sha256());
  return absl::OkStatus();
}

absl::Status DatasetUpload::FinishFile(const std::string& expected_sha256) {
  const std::string actual = std::exchange(sha_, nullptr)->HexDigest();
  const std::string file = std::exchange(current_file_, "");
  std::unique_ptr<AtomicFileWriter> writer = std::exchange(file_, nullptr);
  if (!absl::EqualsIgnoreCase(actual, expected_sha256)) {
    return absl::DataLossError(absl::StrCat("chunk.sha256: ", file, " has sha256 ", actual,
                                            " but the client sent ", expected_sha256));
  }
  KILN_RETURN_IF_ERROR(writer->Commit());
  finished_files_.insert(file);
  return absl::OkStatus();
}

absl::StatusOr<v1::Dataset> DatasetUpload::Commit() {
  if (!current_file_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("chunk.sha256: the last chunk of ",
                                                   current_file_, " must carry the file's sha256"));
  }
  // Loading it once proves the files parse and agree, before the name becomes visible.
  absl::StatusOr<DatasetSplits> splits = LoadImageFolder(temp_dir_);
  if (!splits.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("uploaded dataset is not valid: ", splits.status().message()));
  }
  const std::string final_dir = catalog_->data_dir() + "/" + name_;
  std::error_code ec;
  if (fs::exists(final_dir, ec)) {
    return absl::AlreadyExistsError(absl::StrCat("dataset \"", name_, "\" already exists"));
  }
  fs::rename(temp_dir_, final_dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot publish ", name_, ": ", ec.message()));
  committed_ = true;
  // Makes the folder's new name durable, as the files in it already are.
  KILN_RETURN_IF_ERROR(SyncDirectory(catalog_->data_dir()));
  return catalog_->Describe(name_);
}

}  // namespace kiln::server
