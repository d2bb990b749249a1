#include "server/jobs/dataset_catalog.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <random>
#include <system_error>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/data/idx_reader.h"
#include "engine/status_macros.h"
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

// Reads just the dimensions of an IDX file (gzread reads raw files unchanged).
absl::StatusOr<std::vector<int64_t>> ReadIdxDims(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::array<unsigned char, 4> magic{};
  std::vector<int64_t> dims;
  absl::Status status;
  if (gzread(f, magic.data(), 4) != 4 || magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08 ||
      magic[3] < 1 || magic[3] > 4) {
    status = absl::InvalidArgumentError(absl::StrCat(path, ": not an unsigned-byte IDX file"));
  } else {
    for (int i = 0; i < magic[3] && status.ok(); ++i) {
      std::array<unsigned char, 4> d{};
      if (gzread(f, d.data(), 4) != 4) {
        status = absl::InvalidArgumentError(absl::StrCat(path, ": truncated IDX header"));
      } else {
        dims.push_back((int64_t{d[0]} << 24) | (d[1] << 16) | (d[2] << 8) | d[3]);
      }
    }
  }
  gzclose(f);
  KILN_RETURN_IF_ERROR(status);
  return dims;
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

absl::StatusOr<std::string> Sha256OfFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  std::vector<char> buffer(1 << 20);
  ssize_t n;
  while ((n = read(fd, buffer.data(), buffer.size())) > 0) EVP_DigestUpdate(ctx, buffer.data(), n);
  close(fd);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, digest, &len);
  EVP_MD_CTX_free(ctx);
  if (n < 0) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), static_cast<size_t>(len)));
}

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
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> dims, ReadIdxDims(images));
  if (dims.size() < 2) {
    return absl::FailedPreconditionError(absl::StrCat(images, ": images need rank 3 (N x H x W)"));
  }
  info.train_samples = dims[0];
  info.sample_shape.assign(dims.begin() + 1, dims.end());
  // The labels are small (one byte a sample); reading them gives the class count.
  KILN_ASSIGN_OR_RETURN(IdxArray label_array, ReadIdxFile(labels));
  for (uint8_t label : label_array.data) {
    info.num_classes = std::max<int32_t>(info.num_classes, label + 1);
  }
  const std::string test_images = FindFile(dir, kTestImages);
  if (!test_images.empty()) {
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> test_dims, ReadIdxDims(test_images));
    info.test_samples = test_dims.empty() ? 0 : test_dims[0];
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
  const std::string temp = absl::StrCat(data_dir_, "/", kUploadPrefix, ::getpid(), "-",
                                        RandomSuffix(), "-", name);
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
  if (fd_ >= 0) close(fd_);
  if (sha_ != nullptr) EVP_MD_CTX_free(sha_);
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
    fd_ = open((temp_dir_ + "/" + file).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) return absl::UnavailableError(absl::StrCat("cannot create ", file));
    sha_ = EVP_MD_CTX_new();
    EVP_DigestInit_ex(sha_, EVP_sha256(), nullptr);
    current_file_ = file;
  }
  total_bytes_ += static_cast<int64_t>(chunk.data().size());
  if (total_bytes_ > catalog_->max_upload_bytes()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("upload exceeds the limit of ", catalog_->max_upload_bytes(), " bytes"));
  }
  const std::string& data = chunk.data();
  size_t written = 0;
  while (written < data.size()) {
    ssize_t n = write(fd_, data.data() + written, data.size() - written);
    if (n <= 0) return absl::UnavailableError(absl::StrCat("writing ", file, " failed"));
    written += static_cast<size_t>(n);
  }
  EVP_DigestUpdate(sha_, data.data(), data.size());
  if (!chunk.sha256().empty()) return FinishFile(chunk.sha256());
  return absl::OkStatus();
}

absl::Status DatasetUpload::FinishFile(const std::string& expected_sha256) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(sha_, digest, &len);
  EVP_MD_CTX_free(sha_);
  sha_ = nullptr;
  const bool synced = fsync(fd_) == 0;
  close(fd_);
  fd_ = -1;
  const std::string actual = absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), static_cast<size_t>(len)));
  const std::string file = std::exchange(current_file_, "");
  if (!absl::EqualsIgnoreCase(actual, expected_sha256)) {
    return absl::DataLossError(absl::StrCat("chunk.sha256: ", file, " has sha256 ", actual,
                                            " but the client sent ", expected_sha256));
  }
  if (!synced) return absl::UnavailableError(absl::StrCat("fsync of ", file, " failed"));
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
  return catalog_->Describe(name_);
}

}  // namespace kiln::server
