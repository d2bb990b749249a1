#include "server/datasets/dataset_catalog.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/atomic_file.h"
#include "common/resource_name.h"
#include "common/status_macros.h"
#include "engine/data/idx_reader.h"

namespace kiln::server {
namespace fs = std::filesystem;
namespace {

constexpr const char* kTrainImages = "train-images-idx3-ubyte";
constexpr const char* kTrainLabels = "train-labels-idx1-ubyte";
constexpr const char* kTestImages = "t10k-images-idx3-ubyte";
constexpr const char* kTestLabels = "t10k-labels-idx1-ubyte";

constexpr char kUploadPrefix[] = ".upload-";
// A text upload's files wait here until Commit encodes them; hidden, so never listed as data.
constexpr char kCorpusFolder[] = ".corpus";
constexpr char kDeletingPrefix[] = ".deleting-";

// The file of `base` in `dir`, raw or gzipped; empty when neither exists.
std::string FindFile(const std::string& dir, const std::string& base) {
  for (const std::string& name : {base, base + ".gz"}) {
    std::error_code ec;
    if (fs::is_regular_file(dir + "/" + name, ec)) return dir + "/" + name;
  }
  return "";
}

bool IsUploadFileName(DatasetFormat format, const std::string& name) {
  if (format == DatasetFormat::kText) return IsValidName(name);
  if (format == DatasetFormat::kTokens) {
    return TokenShardNumber(name, kTokenTrainPrefix) >= 0 ||
           TokenShardNumber(name, kTokenValPrefix) >= 0;
  }
  if (format == DatasetFormat::kCifar10) {
    return name == kCifar10TestFile || Cifar10TrainFileNumber(name) > 0;
  }
  if (format == DatasetFormat::kCsv) return name == kCsvTrainFile || name == kCsvTestFile;
  if (format == DatasetFormat::kNpy) {
    return name == kNpyTrainX || name == kNpyTrainY || name == kNpyTestX || name == kNpyTestY;
  }
  for (const char* base : {kTrainImages, kTrainLabels, kTestImages, kTestLabels}) {
    if (name == base || name == absl::StrCat(base, ".gz")) return true;
  }
  return false;
}

// IDX files are one whether raw or gzip; CIFAR-10 batches are never compressed.
std::string BaseName(DatasetFormat format, const std::string& file_name) {
  if (format != DatasetFormat::kIdx) return file_name;
  return std::string(absl::StripSuffix(file_name, ".gz"));
}

std::string InvalidFileNameMessage(DatasetFormat format, const std::string& field,
                                   const std::string& file) {
  if (format == DatasetFormat::kText) {
    return absl::StrCat(field, ": \"", file,
                        "\" is not a valid text file name (1-64 of A-Z a-z 0-9 . _ -, not starting "
                        "with .)");
  }
  if (format == DatasetFormat::kTokens) {
    return absl::StrCat(field, ": \"", file,
                        "\" is not a token shard name: train_<N>.bin or val_<N>.bin (N of 3 to 6 "
                        "digits)");
  }
  if (format == DatasetFormat::kCifar10) {
    return absl::StrCat(field, ": \"", file, "\" is not a CIFAR-10 batch name: data_batch_<N>.bin",
                        " (N in 1..", kCifar10MaxTrainFiles, ", no leading zero) or ",
                        kCifar10TestFile);
  }
  if (format == DatasetFormat::kNpy) {
    return absl::StrCat(field, ": \"", file, "\" is not one of ", kNpyTrainX, ", ", kNpyTrainY,
                        ", ", kNpyTestX, ", ", kNpyTestY);
  }
  if (format == DatasetFormat::kCsv) {
    return absl::StrCat(field, ": \"", file, "\" is not ", kCsvTrainFile, " or ", kCsvTestFile);
  }
  return absl::StrCat(field, ": \"", file, "\" is not one of ", kTrainImages, ", ", kTrainLabels,
                      ", ", kTestImages, ", ", kTestLabels, " (optionally .gz)");
}

// Reads a CIFAR-10 batch through the upload's record check: its record count and largest label.
absl::Status ScanCifar10File(const std::string& path, Cifar10StreamCheck* check) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::FailedPreconditionError(absl::StrCat(path, ": cannot read"));
  std::string buf(size_t{1} << 20, '\0');
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    KILN_RETURN_IF_ERROR(check->Consume(std::string_view(buf.data(), in.gcount())));
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return check->Finish();
}

// A CIFAR-10 folder's facts from its batches: sizes and every label byte.
absl::StatusOr<DatasetInfo> ReadCifar10Facts(const std::string& dir) {
  DatasetInfo info;
  info.format = DatasetFormat::kCifar10;
  info.sample_shape = {3, 32, 32};
  for (const std::string& file : FindCifar10TrainFiles(dir)) {
    Cifar10StreamCheck check(file);
    KILN_RETURN_IF_ERROR(ScanCifar10File(file, &check));
    info.train_samples += check.records();
    info.num_classes = std::max(info.num_classes, check.max_label() + 1);
  }
  const std::string test = dir + "/" + kCifar10TestFile;
  std::error_code ec;
  if (fs::is_regular_file(test, ec)) {
    Cifar10StreamCheck check(test);
    KILN_RETURN_IF_ERROR(ScanCifar10File(test, &check));
    info.test_samples = check.records();
    info.num_classes = std::max(info.num_classes, check.max_label() + 1);
  }
  return info;
}

std::string RandomSuffix() {
  std::random_device rd;
  return absl::StrCat(absl::Hex(rd(), absl::kZeroPad8));
}

// A hidden sibling name for `name` that the next kilnd start can tell is ours and whose (pid).
std::string TempFolderName(const char* prefix, const std::string& name) {
  return absl::StrCat(prefix, ::getpid(), "-", RandomSuffix(), "-", name);
}

// rename(2) that fails with EEXIST rather than replace `to` (an empty folder included).
int RenameNoReplace(const std::string& from, const std::string& to) {
  return ::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE);
}

// The data files of a dataset folder (hidden ones, like the manifest, are not), by name.
// Who uploaded a dataset: "user\nteam\n" in a dot-file beside its data (never listed as one).
constexpr char kOwnerFileName[] = ".kiln-owner";

absl::Status WriteDatasetOwner(const std::string& dir, const v1::Owner& owner) {
  return WriteFileAtomically(absl::StrCat(dir, "/", kOwnerFileName),
                             absl::StrCat(owner.user(), "\n", owner.team(), "\n"));
}

// Empty for a folder without the file (placed by hand) or with one that does not parse.
v1::Owner ReadDatasetOwner(const std::string& dir) {
  v1::Owner owner;
  std::ifstream in(absl::StrCat(dir, "/", kOwnerFileName));
  std::string user, team;
  if (in && std::getline(in, user) && std::getline(in, team) && user.size() <= 64 &&
      team.size() <= 64) {
    owner.set_user(user);
    owner.set_team(team);
  }
  return owner;
}

std::vector<DatasetFileStat> StatFiles(const std::string& dir) {
  std::vector<DatasetFileStat> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, ".") || !entry.is_regular_file(ec)) continue;
    DatasetFileStat f;
    f.name = name;
    f.size_bytes = static_cast<int64_t>(entry.file_size(ec));
    f.mtime_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                     entry.last_write_time(ec).time_since_epoch())
                     .count();
    files.push_back(std::move(f));
  }
  std::sort(files.begin(), files.end(),
            [](const DatasetFileStat& a, const DatasetFileStat& b) { return a.name < b.name; });
  return files;
}

DatasetFileSizes SizesOf(const std::vector<DatasetFileStat>& files) {
  DatasetFileSizes sizes;
  for (const DatasetFileStat& f : files) sizes[f.name] = f.size_bytes;
  return sizes;
}

// Reads a dataset folder's facts from its files: the headers, and every label.
// A CSV folder placed by hand: read with the default options (last column, header detected).
absl::StatusOr<DatasetInfo> ReadCsvFacts(const std::string& dir) {
  KILN_ASSIGN_OR_RETURN(DatasetSplits splits, LoadCsvFolder(dir, CsvOptions()));
  DatasetInfo info;
  info.format = DatasetFormat::kCsv;
  info.sample_shape = splits.train.sample_shape;
  info.train_samples = splits.train.size;
  info.test_samples = splits.test.size;
  info.num_classes = splits.train.num_classes;
  return info;
}

// An NPY folder placed by hand: loaded once (the arrays hold no summary to read instead).
absl::StatusOr<DatasetInfo> ReadNpyFacts(const std::string& dir) {
  KILN_ASSIGN_OR_RETURN(DatasetSplits splits, LoadNpyFolder(dir));
  DatasetInfo info;
  info.format = DatasetFormat::kNpy;
  info.sample_shape = splits.train.sample_shape;
  info.train_samples = splits.train.size;
  info.test_samples = splits.test.size;
  info.num_classes = splits.train.num_classes;
  return info;
}

// A token folder placed by hand: its shards' headers, and every token once for the largest.
absl::StatusOr<DatasetInfo> ReadTokenFacts(const std::string& dir, DatasetFormat format) {
  KILN_ASSIGN_OR_RETURN(TokenDataset ds, OpenTokenDataset(dir));
  DatasetInfo info;
  info.format = format;
  info.train_tokens = ds.train.tokens();
  info.val_tokens = ds.val.tokens();
  info.vocab_size = ds.vocab_size;
  info.max_token = ds.max_token;
  return info;
}

absl::StatusOr<DatasetInfo> ReadFacts(const std::string& dir, const std::string& name) {
  switch (const DatasetFormat format = DetectDatasetFormat(dir)) {
    case DatasetFormat::kText:
    case DatasetFormat::kTokens:
      return ReadTokenFacts(dir, format);
    case DatasetFormat::kCifar10:
      return ReadCifar10Facts(dir);
    case DatasetFormat::kCsv:
      return ReadCsvFacts(dir);
    case DatasetFormat::kNpy:
      return ReadNpyFacts(dir);
    case DatasetFormat::kIdx:
      break;
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
  // The labels of both splits give the class count the model must cover.
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

}  // namespace

absl::Status DatasetCatalog::CheckFolder(const std::string& name) const {
  if (!IsValidName(name)) {
    return absl::InvalidArgumentError(absl::StrCat("dataset name \"", name, "\" is not valid"));
  }
  std::error_code ec;
  if (!fs::is_directory(PathOf(name), ec)) return NotFound(name);
  return absl::OkStatus();
}

absl::Status DatasetCatalog::NotFound(const std::string& name) const {
  return absl::NotFoundError(absl::StrCat("dataset \"", name, "\" not found in ", data_dir_));
}

v1::Owner DatasetCatalog::OwnerOf(const std::string& name) const {
  if (!IsValidName(name)) return v1::Owner();
  return ReadDatasetOwner(PathOf(name));
}

bool DatasetCatalog::Exists(const std::string& name) const {
  std::error_code ec;
  return IsValidName(name) && fs::is_directory(PathOf(name), ec);
}

absl::StatusOr<DatasetInfo> DatasetCatalog::Facts(const std::string& name,
                                                  const std::vector<DatasetFileStat>& files) const {
  const std::string dir = PathOf(name);
  if (std::optional<DatasetInfo> recorded = ReadDatasetManifest(dir, SizesOf(files))) {
    return *recorded;
  }
  std::string signature;
  for (const DatasetFileStat& f : files) {
    absl::StrAppend(&signature, f.name, ":", f.size_bytes, ":", f.mtime_ns, ";");
  }
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(name);
    if (it != cache_.end() && it->second.signature == signature) return it->second.info;
  }
  // Read outside the lock: inflating labels takes a while and other datasets need not wait.
  KILN_ASSIGN_OR_RETURN(DatasetInfo info, ReadFacts(dir, name));
  std::lock_guard<std::mutex> lock(cache_mu_);
  cache_[name] = CachedFacts{std::move(signature), info};
  return info;
}

absl::StatusOr<DatasetInfo> DatasetCatalog::Inspect(const std::string& name) const {
  KILN_RETURN_IF_ERROR(CheckFolder(name));
  return Facts(name, StatFiles(PathOf(name)));
}

absl::StatusOr<v1::Dataset> DatasetCatalog::Describe(const std::string& name) const {
  KILN_RETURN_IF_ERROR(CheckFolder(name));
  const std::vector<DatasetFileStat> files = StatFiles(PathOf(name));
  KILN_ASSIGN_OR_RETURN(DatasetInfo info, Facts(name, files));
  v1::Dataset d;
  d.set_name(name);
  if (v1::Owner owner = ReadDatasetOwner(PathOf(name)); !owner.user().empty()) {
    *d.mutable_owner() = std::move(owner);
  }
  d.set_train_samples(info.train_samples);
  d.set_test_samples(info.test_samples);
  for (int64_t dim : info.sample_shape) d.add_sample_shape(dim);
  d.set_num_classes(info.num_classes);
  d.set_format(info.format == DatasetFormat::kCifar10  ? v1::DATASET_FORMAT_CIFAR10
               : info.format == DatasetFormat::kCsv    ? v1::DATASET_FORMAT_CSV
               : info.format == DatasetFormat::kNpy    ? v1::DATASET_FORMAT_NPY
               : info.format == DatasetFormat::kText   ? v1::DATASET_FORMAT_TEXT
               : info.format == DatasetFormat::kTokens ? v1::DATASET_FORMAT_TOKENS
                                                       : v1::DATASET_FORMAT_IDX);
  if (IsTokenFormat(info.format)) {
    d.set_train_tokens(info.train_tokens);
    d.set_val_tokens(info.val_tokens);
    d.set_vocab_size(info.vocab_size);
    d.set_max_token(info.max_token);
  }
  int64_t bytes = 0;
  for (const DatasetFileStat& f : files) {
    d.add_files(f.name);
    bytes += f.size_bytes;
  }
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
  const std::string dir = PathOf(name);
  // The manifest's format when it still describes the files; otherwise the files tell.
  const std::optional<DatasetInfo> recorded = ReadDatasetManifest(dir, SizesOf(StatFiles(dir)));
  const DatasetFormat format = recorded ? recorded->format : DetectDatasetFormat(dir);
  if (IsTokenFormat(format)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset \"", name, "\" holds tokens (format ", std::string(DatasetFormatName(format)),
        "): it feeds a language model, which opens it; it has no samples to load"));
  }
  if (format == DatasetFormat::kCsv) {
    return LoadCsvFolder(dir, recorded ? recorded->csv : CsvOptions());
  }
  return LoadDatasetFolder(dir, format);
}

absl::StatusOr<TokenDataset> DatasetCatalog::OpenTokens(const std::string& name) const {
  KILN_RETURN_IF_ERROR(CheckFolder(name));
  const std::string dir = PathOf(name);
  const std::optional<DatasetInfo> recorded = ReadDatasetManifest(dir, SizesOf(StatFiles(dir)));
  const DatasetFormat format = recorded ? recorded->format : DetectDatasetFormat(dir);
  if (!IsTokenFormat(format)) {
    return absl::InvalidArgumentError(absl::StrCat("dataset \"", name, "\" holds samples (format ",
                                                   std::string(DatasetFormatName(format)),
                                                   "), not tokens"));
  }
  absl::StatusOr<TokenDataset> ds = OpenTokenDataset(dir);
  if (!ds.ok()) {
    return absl::Status(ds.status().code(),
                        absl::StrCat("dataset \"", name, "\": ", ds.status().message()));
  }
  return ds;
}

absl::StatusOr<std::unique_ptr<DatasetUpload>> DatasetCatalog::BeginUpload(
    const std::string& name, const std::vector<std::string>& declared_files, DatasetFormat format,
    const CsvOptions& csv, double val_fraction) const {
  if (format == DatasetFormat::kText && !(val_fraction > 0 && val_fraction <= 0.5)) {
    return absl::InvalidArgumentError(
        absl::StrCat("header.val_fraction: must be in (0, 0.5], got ", val_fraction));
  }
  if (!(csv.test_fraction >= 0 && csv.test_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("header.csv.test_fraction: must be in [0, 1), got ", csv.test_fraction));
  }
  if (!IsValidName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("header.name: \"", name,
                     "\" is not valid (1-64 of A-Z a-z 0-9 . _ -, not starting with .)"));
  }
  std::set<std::string> declared;
  std::set<std::string> bases;
  for (const std::string& file : declared_files) {
    if (!IsUploadFileName(format, file)) {
      return absl::InvalidArgumentError(InvalidFileNameMessage(format, "header.files", file));
    }
    if (!bases.insert(BaseName(format, file)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("header.files: ", BaseName(format, file), " is listed twice"));
    }
    declared.insert(file);
  }
  if (!declared.empty() && format == DatasetFormat::kNpy) {
    if (bases.count(kNpyTrainX) == 0 || bases.count(kNpyTrainY) == 0 ||
        bases.count(kNpyTestX) != bases.count(kNpyTestY)) {
      return absl::InvalidArgumentError(
          "header.files: an NPY dataset needs train_x.npy and train_y.npy (and test_x.npy with "
          "test_y.npy)");
    }
  } else if (!declared.empty() && format == DatasetFormat::kTokens) {
    if (std::none_of(bases.begin(), bases.end(), [](const std::string& b) {
          return TokenShardNumber(b, kTokenTrainPrefix) >= 0;
        })) {
      return absl::InvalidArgumentError(
          "header.files: a token dataset needs at least one train_<N>.bin (the train split)");
    }
  } else if (format == DatasetFormat::kText) {
    // Any names; the corpus is checked when it is complete.
  } else if (!declared.empty() && format == DatasetFormat::kCsv) {
    if (bases.count(kCsvTrainFile) == 0) {
      return absl::InvalidArgumentError("header.files: a CSV dataset needs train.csv");
    }
  } else if (!declared.empty() && format == DatasetFormat::kCifar10) {
    if (std::none_of(bases.begin(), bases.end(),
                     [](const std::string& b) { return Cifar10TrainFileNumber(b) > 0; })) {
      return absl::InvalidArgumentError(
          "header.files: a CIFAR-10 dataset needs at least one data_batch_<N>.bin (the train "
          "split)");
    }
  } else if (!declared.empty()) {
    std::vector<std::string> missing;
    for (const char* base : {kTrainImages, kTrainLabels}) {
      if (bases.count(base) == 0) missing.emplace_back(base);
    }
    if (bases.count(kTestImages) != bases.count(kTestLabels)) {
      missing.emplace_back(bases.count(kTestImages) > 0 ? kTestLabels : kTestImages);
    }
    if (!missing.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("header.files: a dataset needs ", absl::StrJoin(missing, " and "),
                       " too (the train images and labels, and the test ones together)"));
    }
  }
  std::error_code ec;
  if (fs::exists(PathOf(name), ec)) {
    return absl::AlreadyExistsError(absl::StrCat("dataset \"", name, "\" already exists"));
  }
  // The pid lets the next kilnd start tell an abandoned upload from a live one
  // (TempFolderWriterPid, server/jobs/interrupted_writes.h).
  const std::string temp = absl::StrCat(data_dir_, "/", TempFolderName(kUploadPrefix, name));
  const std::string made = format == DatasetFormat::kText ? temp + "/" + kCorpusFolder : temp;
  if (!fs::create_directories(made, ec)) {
    fs::remove_all(temp, ec);
    return absl::UnavailableError(absl::StrCat("cannot create ", made, ": ", ec.message()));
  }
  return std::unique_ptr<DatasetUpload>(
      new DatasetUpload(this, name, temp, std::move(declared), format, csv, val_fraction));
}

absl::Status DatasetCatalog::Delete(const std::string& name) {
  KILN_RETURN_IF_ERROR(CheckFolder(name));
  // Readers see the whole dataset or none of it: the rename is the deletion, the rest cleanup.
  const std::string aside = absl::StrCat(data_dir_, "/", TempFolderName(kDeletingPrefix, name));
  if (RenameNoReplace(PathOf(name), aside) != 0) {
    const int err = errno;
    if (err == ENOENT) {
      return NotFound(name);
    }
    return absl::UnavailableError(
        absl::StrCat("cannot delete dataset \"", name, "\": rename: ", std::strerror(err)));
  }
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    cache_.erase(name);
  }
  KILN_RETURN_IF_ERROR(SyncDirectory(data_dir_));
  // Files that cannot be removed now go at the next start (RemoveInterruptedWrites).
  std::error_code ec;
  fs::remove_all(aside, ec);
  return absl::OkStatus();
}

int DatasetCatalog::TempFolderWriterPid(const std::string& dir_name) {
  size_t begin = 0;
  for (absl::string_view prefix : {kUploadPrefix, kDeletingPrefix}) {
    if (absl::StartsWith(dir_name, prefix)) begin = prefix.size();
  }
  if (begin == 0) return -1;
  const size_t dash = dir_name.find('-', begin);
  if (dash == std::string::npos) return -1;
  int pid = 0;
  if (!absl::SimpleAtoi(absl::string_view(dir_name).substr(begin, dash - begin), &pid) ||
      pid <= 0) {
    return -1;
  }
  return pid;
}

DatasetUpload::DatasetUpload(const DatasetCatalog* catalog, std::string name, std::string temp_dir,
                             std::set<std::string> declared_files, DatasetFormat format,
                             CsvOptions csv, double val_fraction)
    : catalog_(catalog),
      name_(std::move(name)),
      temp_dir_(std::move(temp_dir)),
      declared_files_(std::move(declared_files)),
      format_(format),
      csv_(std::move(csv)),
      val_fraction_(val_fraction) {}

std::string DatasetUpload::StoredPath(const std::string& file) const {
  if (format_ == DatasetFormat::kText)
    return absl::StrCat(temp_dir_, "/", kCorpusFolder, "/", file);
  return absl::StrCat(temp_dir_, "/", file);
}

DatasetUpload::~DatasetUpload() {
  current_.reset();  // removes an unfinished file's temp before the folder goes
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(temp_dir_, ec);
  }
}

absl::Status DatasetUpload::Append(const v1::DatasetFileChunk& chunk) {
  const std::string& file = chunk.file_name();
  if (!IsUploadFileName(format_, file)) {
    return absl::InvalidArgumentError(InvalidFileNameMessage(format_, "chunk.file_name", file));
  }
  if (!current_ || current_->file_name != file) {
    if (current_) {
      return absl::InvalidArgumentError(absl::StrCat("chunk.file_name: \"", file,
                                                     "\" started before \"", current_->file_name,
                                                     "\" ended (its last chunk carries sha256)"));
    }
    if (auto done = finished_.find(BaseName(format_, file)); done != finished_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("chunk.file_name: \"", file,
                                                     "\" was already uploaded (as \"",
                                                     done->second.file_name, "\")"));
    }
    if (!declared_files_.empty() && declared_files_.count(file) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("chunk.file_name: \"", file,
                                                     "\" is not in header.files (",
                                                     absl::StrJoin(declared_files_, ", "), ")"));
    }
    auto next = std::make_unique<FileInProgress>();
    next->file_name = file;
    if (format_ == DatasetFormat::kCifar10) {
      next->cifar = std::make_unique<Cifar10StreamCheck>(file);
    }
    if (format_ == DatasetFormat::kNpy) {
      next->npy = std::make_unique<NpyStreamCheck>(file, file == kNpyTrainY || file == kNpyTestY
                                                             ? NpyStreamCheck::Role::kLabels
                                                             : NpyStreamCheck::Role::kSamples);
    }
    if (format_ == DatasetFormat::kCsv) {
      next->csv = std::make_unique<CsvStreamCheck>(file, csv_, CsvStreamCheck::Keep::kCountsOnly);
    }
    if (format_ == DatasetFormat::kTokens) {
      next->shard = std::make_unique<TokenShardStreamCheck>(file);
    }
    if (format_ == DatasetFormat::kText) next->text = std::make_unique<Utf8StreamCheck>(file);
    KILN_ASSIGN_OR_RETURN(next->writer, AtomicFileWriter::Open(StoredPath(file)));
    current_ = std::move(next);
  }
  stored_bytes_ += static_cast<int64_t>(chunk.data().size());
  current_->stored_bytes += static_cast<int64_t>(chunk.data().size());
  if (stored_bytes_ > catalog_->max_upload_bytes()) {
    return absl::ResourceExhaustedError(absl::StrCat("upload exceeds the limit of ",
                                                     catalog_->max_upload_bytes(),
                                                     " bytes (--max_upload_bytes) at ", file));
  }
  KILN_RETURN_IF_ERROR(Scan(chunk.data()));
  KILN_RETURN_IF_ERROR(current_->writer->Append(chunk.data()));
  current_->sha.Update(chunk.data());
  if (!chunk.sha256().empty()) return FinishFile(chunk.sha256());
  return absl::OkStatus();
}

absl::Status DatasetUpload::Scan(absl::string_view stored) {
  FileInProgress& f = *current_;
  if (f.cifar || f.csv || f.npy || f.shard || f.text) return CountAndCheck(stored);
  if (!f.facts) {
    // gzip is told by its magic (1f 8b), as the engine's reader tells it, not by the name.
    const size_t take = std::min<size_t>(2 - f.first_bytes.size(), stored.size());
    f.first_bytes.append(stored.data(), take);
    stored.remove_prefix(take);
    if (f.first_bytes.size() < 2) return absl::OkStatus();
    const bool gzip = static_cast<uint8_t>(f.first_bytes[0]) == 0x1f &&
                      static_cast<uint8_t>(f.first_bytes[1]) == 0x8b;
    if (gzip) f.gunzip = std::make_unique<GunzipStream>(f.file_name);
    f.facts = std::make_unique<IdxStreamFacts>(f.file_name, gzip ? "decompressed file" : "file");
    KILN_RETURN_IF_ERROR(Scan(std::exchange(f.first_bytes, "")));
  }
  if (stored.empty()) return absl::OkStatus();
  if (f.gunzip) {
    return f.gunzip->Feed(stored, [this](absl::string_view piece) { return CountAndCheck(piece); });
  }
  return CountAndCheck(stored);
}

absl::Status DatasetUpload::CountAndCheck(absl::string_view decompressed) {
  decompressed_bytes_ += static_cast<int64_t>(decompressed.size());
  if (decompressed_bytes_ > catalog_->max_upload_bytes()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("upload exceeds the limit of ", catalog_->max_upload_bytes(),
                     " bytes (--max_upload_bytes), counted decompressed: ", current_->file_name,
                     " inflates past it"));
  }
  if (current_->text) {
    return current_->text->Consume(std::string_view(decompressed.data(), decompressed.size()));
  }
  if (current_->shard) {
    return current_->shard->Consume(decompressed);
  }
  if (current_->npy) {
    return current_->npy->Consume(std::string_view(decompressed.data(), decompressed.size()));
  }
  if (current_->csv) {
    return current_->csv->Consume(std::string_view(decompressed.data(), decompressed.size()));
  }
  if (current_->cifar) {
    return current_->cifar->Consume(std::string_view(decompressed.data(), decompressed.size()));
  }
  return current_->facts->Consume(decompressed);
}

absl::Status DatasetUpload::FinishFile(const std::string& expected_sha256) {
  std::unique_ptr<FileInProgress> f = std::move(current_);
  const std::string actual = f->sha.HexDigest();
  if (!absl::EqualsIgnoreCase(actual, expected_sha256)) {
    return absl::DataLossError(absl::StrCat("chunk.sha256: ", f->file_name, " has sha256 ", actual,
                                            " but the client sent ", expected_sha256));
  }
  if (f->text) {
    if (absl::Status s = f->text->Finish(); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("uploaded dataset is not valid: ", s.message()));
    }
    KILN_RETURN_IF_ERROR(f->writer->Commit());
    FileFacts facts;
    facts.file_name = f->file_name;
    facts.stored_bytes = f->stored_bytes;
    text_order_.push_back(f->file_name);
    finished_[f->file_name] = std::move(facts);
    return absl::OkStatus();
  }
  if (f->shard) {
    if (absl::Status s = f->shard->Finish(); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("uploaded dataset is not valid: ", s.message()));
    }
    KILN_RETURN_IF_ERROR(f->writer->Commit());
    FileFacts facts;
    facts.file_name = f->file_name;
    facts.dims = {f->shard->tokens()};
    facts.max_element = f->shard->max_token();
    facts.stored_bytes = f->stored_bytes;
    finished_[f->file_name] = std::move(facts);
    return absl::OkStatus();
  }
  if (f->npy) {
    if (absl::Status s = f->npy->Finish(); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("uploaded dataset is not valid: ", s.message()));
    }
    KILN_RETURN_IF_ERROR(f->writer->Commit());
    FileFacts facts;
    facts.file_name = f->file_name;
    facts.dims = f->npy->header().shape;
    facts.kind = f->npy->header().kind;
    facts.max_element = f->npy->max_label();
    facts.stored_bytes = f->stored_bytes;
    finished_[f->file_name] = std::move(facts);
    return absl::OkStatus();
  }
  if (f->csv) {
    if (absl::Status s = f->csv->Finish(); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("uploaded dataset is not valid: ", s.message()));
    }
    KILN_RETURN_IF_ERROR(f->writer->Commit());
    FileFacts facts;
    facts.file_name = f->file_name;
    facts.dims = {f->csv->rows(), f->csv->features()};
    facts.max_element = f->csv->max_label();
    facts.stored_bytes = f->stored_bytes;
    finished_[f->file_name] = std::move(facts);
    return absl::OkStatus();
  }
  if (f->cifar) {
    if (absl::Status s = f->cifar->Finish(); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("uploaded dataset is not valid: ", s.message()));
    }
    KILN_RETURN_IF_ERROR(f->writer->Commit());
    FileFacts facts;
    facts.file_name = f->file_name;
    facts.dims = {f->cifar->records(), 3, 32, 32};
    facts.max_element = f->cifar->max_label();
    facts.stored_bytes = f->stored_bytes;
    finished_[f->file_name] = std::move(facts);
    return absl::OkStatus();
  }
  if (!f->facts) {
    // Under two bytes: too short for either format; the IDX check says how.
    f->facts = std::make_unique<IdxStreamFacts>(f->file_name, "file");
    KILN_RETURN_IF_ERROR(f->facts->Consume(std::exchange(f->first_bytes, "")));
  }
  if (f->gunzip) KILN_RETURN_IF_ERROR(f->gunzip->Finish());
  if (absl::Status s = f->facts->Finish(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("uploaded dataset is not valid: ", s.message()));
  }
  KILN_RETURN_IF_ERROR(f->writer->Commit());
  FileFacts facts;
  facts.file_name = f->file_name;
  facts.dims = f->facts->dims();
  facts.max_element = f->facts->max_element();
  facts.stored_bytes = f->stored_bytes;
  finished_[BaseName(format_, f->file_name)] = std::move(facts);
  return absl::OkStatus();
}

absl::StatusOr<DatasetInfo> DatasetUpload::CheckCompleteCifar10() const {
  DatasetInfo info;
  info.format = DatasetFormat::kCifar10;
  info.sample_shape = {3, 32, 32};
  for (const auto& [base, f] : finished_) {
    (base == kCifar10TestFile ? info.test_samples : info.train_samples) += f.dims[0];
    info.num_classes = std::max(info.num_classes, f.max_element + 1);
  }
  if (info.train_samples == 0) {
    return absl::InvalidArgumentError(
        "uploaded dataset is not valid: missing data_batch_<N>.bin (a CIFAR-10 dataset has at "
        "least one train batch, and optionally test_batch.bin)");
  }
  return info;
}

absl::StatusOr<DatasetInfo> DatasetUpload::CheckCompleteNpy() const {
  const auto invalid = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("uploaded dataset is not valid: ", what));
  };
  if (finished_.count(kNpyTrainX) == 0 || finished_.count(kNpyTrainY) == 0) {
    return invalid("missing train_x.npy or train_y.npy");
  }
  if (finished_.count(kNpyTestX) != finished_.count(kNpyTestY)) {
    return invalid("test_x.npy and test_y.npy go together");
  }
  DatasetInfo info;
  info.format = DatasetFormat::kNpy;
  // As ParseNpySplit checks one split.
  auto split = [&](const char* x_name, const char* y_name) -> absl::StatusOr<int64_t> {
    const FileFacts& x = finished_.at(x_name);
    const FileFacts& y = finished_.at(y_name);
    if (x.dims[0] != y.dims[0]) {
      return invalid(absl::StrCat("count mismatch: ", x_name, " has ", x.dims[0], " samples but ",
                                  y_name, " has ", y.dims[0], " labels"));
    }
    if (x.kind == 'f' && x.dims[1] > kMaxCsvFeatures) {
      return invalid(
          absl::StrCat(x_name, ": ", x.dims[1], " float features; at most ", kMaxCsvFeatures));
    }
    info.num_classes = std::max(info.num_classes, y.max_element + 1);
    return x.dims[0];
  };
  KILN_ASSIGN_OR_RETURN(info.train_samples, split(kNpyTrainX, kNpyTrainY));
  const FileFacts& train = finished_.at(kNpyTrainX);
  info.sample_shape.assign(train.dims.begin() + 1, train.dims.end());
  if (info.sample_shape.empty()) info.sample_shape = {1};
  if (auto test = finished_.find(kNpyTestX); test != finished_.end()) {
    KILN_ASSIGN_OR_RETURN(info.test_samples, split(kNpyTestX, kNpyTestY));
    if (!std::equal(test->second.dims.begin() + 1, test->second.dims.end(), train.dims.begin() + 1,
                    train.dims.end()) ||
        test->second.kind != train.kind) {
      return invalid("test_x.npy does not hold samples of train_x.npy's shape and dtype");
    }
  }
  return info;
}

absl::StatusOr<DatasetInfo> DatasetUpload::CheckCompleteTokens() const {
  DatasetInfo info;
  info.format = DatasetFormat::kTokens;
  bool any_train = false;
  for (const auto& [base, f] : finished_) {
    const bool train = TokenShardNumber(base, kTokenTrainPrefix) >= 0;
    any_train = any_train || train;
    (train ? info.train_tokens : info.val_tokens) += f.dims[0];
    info.max_token = std::max(info.max_token, f.max_element);
  }
  if (!any_train) {
    return absl::InvalidArgumentError(
        "uploaded dataset is not valid: missing train_<N>.bin (a token dataset has at least one "
        "train shard, and optionally val_<N>.bin shards)");
  }
  return info;
}

absl::StatusOr<DatasetInfo> DatasetUpload::EncodeText() {
  if (text_order_.empty()) {
    return absl::InvalidArgumentError(
        "uploaded dataset is not valid: no text file (a text dataset has one or more UTF-8 files)");
  }
  std::vector<MappedFile> maps;
  std::vector<TextSource> sources;
  for (const std::string& file : text_order_) {
    KILN_ASSIGN_OR_RETURN(MappedFile map,
                          MappedFile::Open(StoredPath(file), "an uploaded text file",
                                           MappedFile::Access::kSequential));
    maps.push_back(std::move(map));
    sources.push_back(TextSource{file, maps.back().bytes()});
  }
  absl::StatusOr<TextCorpusFacts> facts = EncodeTextCorpus(sources, val_fraction_, temp_dir_);
  if (!facts.ok()) {
    return absl::Status(facts.status().code(),
                        absl::StrCat("uploaded dataset is not valid: ", facts.status().message()));
  }
  maps.clear();
  // The shards hold the whole corpus; the text itself is not kept.
  std::error_code ec;
  fs::remove_all(absl::StrCat(temp_dir_, "/", kCorpusFolder), ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot remove the uploaded text of ", name_, ": ", ec.message()));
  }
  DatasetInfo info;
  info.format = DatasetFormat::kText;
  info.train_tokens = facts->train_tokens;
  info.val_tokens = facts->val_tokens;
  info.vocab_size = facts->vocabulary.size();
  // Every character of the vocabulary occurs in the corpus, the last one included.
  info.max_token = facts->vocabulary.size() - 1;
  return info;
}

absl::StatusOr<DatasetInfo> DatasetUpload::CheckCompleteCsv() const {
  auto train = finished_.find(kCsvTrainFile);
  if (train == finished_.end()) {
    return absl::InvalidArgumentError(
        "uploaded dataset is not valid: missing train.csv (a CSV dataset has train.csv, and "
        "optionally test.csv)");
  }
  DatasetInfo info;
  info.format = DatasetFormat::kCsv;
  info.csv = csv_;
  info.sample_shape = {train->second.dims[1]};
  info.train_samples = train->second.dims[0];
  info.num_classes = train->second.max_element + 1;
  if (auto test = finished_.find(kCsvTestFile); test != finished_.end()) {
    if (test->second.dims[1] != train->second.dims[1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("uploaded dataset is not valid: test.csv has ", test->second.dims[1],
                       " feature columns but train.csv has ", train->second.dims[1]));
    }
    info.test_samples = test->second.dims[0];
    info.num_classes = std::max(info.num_classes, test->second.max_element + 1);
  } else if (csv_.test_fraction > 0) {
    // As LoadCsvFolder splits: the last floor(rows * fraction) rows.
    const auto n = static_cast<int64_t>(std::floor(info.train_samples * csv_.test_fraction));
    if (n < 1 || n >= info.train_samples) {
      return absl::InvalidArgumentError(absl::StrCat(
          "uploaded dataset is not valid: header.csv.test_fraction ", csv_.test_fraction, " of ",
          info.train_samples, " rows of train.csv leaves an empty split"));
    }
    info.train_samples -= n;
    info.test_samples = n;
  }
  return info;
}

absl::StatusOr<DatasetInfo> DatasetUpload::CheckComplete() const {
  std::vector<std::string> missing;
  for (const std::string& file : declared_files_) {
    if (finished_.count(BaseName(format_, file)) == 0) missing.push_back(file);
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("upload incomplete: the stream ended without ", absl::StrJoin(missing, ", "),
                     " (listed in header.files); nothing was published"));
  }
  if (format_ == DatasetFormat::kCifar10) return CheckCompleteCifar10();
  if (format_ == DatasetFormat::kCsv) return CheckCompleteCsv();
  if (format_ == DatasetFormat::kNpy) return CheckCompleteNpy();
  if (format_ == DatasetFormat::kTokens) return CheckCompleteTokens();
  if (format_ == DatasetFormat::kText) return DatasetInfo{};  // Commit encodes it
  for (const char* base : {kTrainImages, kTrainLabels}) {
    if (finished_.count(base) == 0) missing.emplace_back(base);
  }
  const bool test_images = finished_.count(kTestImages) > 0;
  if (test_images != (finished_.count(kTestLabels) > 0)) {
    missing.emplace_back(test_images ? kTestLabels : kTestImages);
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "uploaded dataset is not valid: missing ", absl::StrJoin(missing, ", "),
        " (a dataset has train images and labels, and optionally test images and labels)"));
  }
  DatasetInfo info;
  // Checks one split's pair as LoadImagesAndLabels would; returns its sample count.
  auto check_split = [&](const char* images_base, const char* labels_base) -> absl::Status {
    const FileFacts& images = finished_.at(images_base);
    const FileFacts& labels = finished_.at(labels_base);
    if (images.dims.size() != 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          "uploaded dataset is not valid: ", images.file_name,
          ": wrong rank for images: expected rank 3 (N x H x W) but the file has rank ",
          images.dims.size(), " (", absl::StrJoin(images.dims, "x"), ")"));
    }
    if (labels.dims.size() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("uploaded dataset is not valid: ", labels.file_name,
                       ": wrong rank for labels: expected rank 1 (N) but the file has rank ",
                       labels.dims.size(), " (", absl::StrJoin(labels.dims, "x"), ")"));
    }
    if (images.dims[0] != labels.dims[0]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "uploaded dataset is not valid: count mismatch: ", images.file_name, " has ",
          images.dims[0], " images but ", labels.file_name, " has ", labels.dims[0], " labels"));
    }
    info.num_classes = std::max(info.num_classes, labels.max_element + 1);
    return absl::OkStatus();
  };
  KILN_RETURN_IF_ERROR(check_split(kTrainImages, kTrainLabels));
  const FileFacts& train = finished_.at(kTrainImages);
  info.train_samples = train.dims[0];
  info.sample_shape.assign(train.dims.begin() + 1, train.dims.end());
  if (test_images) {
    KILN_RETURN_IF_ERROR(check_split(kTestImages, kTestLabels));
    const FileFacts& test = finished_.at(kTestImages);
    if (!std::equal(test.dims.begin() + 1, test.dims.end(), train.dims.begin() + 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("uploaded dataset is not valid: sample shape mismatch: ", train.file_name,
                       " has ", absl::StrJoin(info.sample_shape, "x"), " images but ",
                       test.file_name, " has ", test.dims[1], "x", test.dims[2]));
    }
    info.test_samples = test.dims[0];
  }
  return info;
}

absl::StatusOr<v1::Dataset> DatasetUpload::Commit() {
  if (current_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk.sha256: the last chunk of ", current_->file_name, " must carry the file's sha256"));
  }
  KILN_ASSIGN_OR_RETURN(DatasetInfo info, CheckComplete());
  DatasetFileSizes files;
  if (format_ == DatasetFormat::kText) {
    KILN_ASSIGN_OR_RETURN(info, EncodeText());
    files = SizesOf(StatFiles(temp_dir_));
  } else {
    for (const auto& [base, f] : finished_) files[f.file_name] = f.stored_bytes;
  }
  // The facts are gathered once, here, for every later listing and submission to read.
  KILN_RETURN_IF_ERROR(WriteDatasetManifest(temp_dir_, info, files));
  if (!owner_.user().empty()) KILN_RETURN_IF_ERROR(WriteDatasetOwner(temp_dir_, owner_));
  const std::string final_dir = catalog_->data_dir() + "/" + name_;
  if (RenameNoReplace(temp_dir_, final_dir) != 0) {
    const int err = errno;
    if (err == EEXIST || err == ENOTEMPTY) {
      return absl::AlreadyExistsError(absl::StrCat("dataset \"", name_, "\" already exists"));
    }
    return absl::UnavailableError(
        absl::StrCat("cannot publish ", name_, ": rename: ", std::strerror(err)));
  }
  committed_ = true;
  // Makes the folder's new name durable, as the files in it already are.
  KILN_RETURN_IF_ERROR(SyncDirectory(catalog_->data_dir()));
  return catalog_->Describe(name_);
}

}  // namespace kiln::server
