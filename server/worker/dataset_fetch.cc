#include "server/worker/dataset_fetch.h"

#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace kiln::worker {
namespace fs = std::filesystem;
namespace {

// A whole dataset may be large, but a stalled transfer must still end.
constexpr absl::Duration kFetchTimeout = absl::Hours(1);

bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

// One file of the stream, written to its final name in `dir` when its digest matches.
class FileReceiver {
 public:
  static absl::StatusOr<std::unique_ptr<FileReceiver>> Start(const std::string& dir,
                                                             const std::string& name) {
    if (!IsPlainFileName(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("kilnd sent a dataset file named \"", name, "\", not a plain file name"));
    }
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> writer,
                          AtomicFileWriter::Open(dir + "/" + name));
    return std::unique_ptr<FileReceiver>(new FileReceiver(name, std::move(writer)));
  }

  absl::Status Append(const std::string& data) {
    digest_.Update(data);
    return writer_->Append(data);
  }

  // The last chunk carried `sha256`: checks it and publishes the file.
  absl::Status Finish(const std::string& sha256) {
    const std::string got = digest_.HexDigest();
    if (got != sha256) {
      return absl::DataLossError(absl::StrCat("dataset file ", name_,
                                              " arrived damaged: its sha256 is ", got,
                                              ", kilnd said ", sha256));
    }
    return writer_->Commit();
  }

  const std::string& name() const { return name_; }

 private:
  FileReceiver(std::string name, std::unique_ptr<AtomicFileWriter> writer)
      : name_(std::move(name)), writer_(std::move(writer)) {}

  std::string name_;
  std::unique_ptr<AtomicFileWriter> writer_;
  Sha256 digest_;
};

// Receives every file of the dataset into `dir`; returns their sha256 by name.
absl::StatusOr<std::map<std::string, std::string>> ReceiveFiles(CoordinatorConnection& connection,
                                                                const std::string& job_id,
                                                                const std::string& dir) {
  v1::ReadDatasetRequest request;
  request.set_job_id(job_id);
  auto context = connection.NewContext(kFetchTimeout);
  std::unique_ptr<grpc::ClientReader<v1::DatasetFileChunk>> reader =
      connection.stub().ReadDataset(context.get(), request);
  std::unique_ptr<FileReceiver> file;
  std::map<std::string, std::string> received;
  v1::DatasetFileChunk chunk;
  absl::Status error;
  while (error.ok() && reader->Read(&chunk)) {
    if (file != nullptr && chunk.file_name() != file->name()) {
      error = absl::DataLossError(
          absl::StrCat("dataset file ", file->name(), " ended without its sha256"));
      break;
    }
    if (file == nullptr) {
      if (received.count(chunk.file_name()) > 0) {
        error = absl::DataLossError(
            absl::StrCat("kilnd sent dataset file ", chunk.file_name(), " twice"));
        break;
      }
      absl::StatusOr<std::unique_ptr<FileReceiver>> started =
          FileReceiver::Start(dir, chunk.file_name());
      if (!started.ok()) {
        error = started.status();
        break;
      }
      file = *std::move(started);
    }
    error = file->Append(chunk.data());
    if (error.ok() && !chunk.sha256().empty()) {
      error = file->Finish(chunk.sha256());
      received[file->name()] = chunk.sha256();
      file.reset();
    }
  }
  if (!error.ok()) {
    context->TryCancel();
    reader->Finish().IgnoreError();
    return error;
  }
  KILN_RETURN_IF_ERROR(FromGrpc(reader->Finish(), "reading the dataset from kilnd"));
  if (file != nullptr) {
    return absl::DataLossError(
        absl::StrCat("dataset file ", file->name(), " ended without its sha256"));
  }
  if (received.empty()) return absl::DataLossError("kilnd sent no dataset files");
  return received;
}

// Whether `dir` holds exactly the files of `digests`, each with its digest: another rank on
// this machine fetched the same dataset first.
bool HoldsTheSameFiles(const std::string& dir, const std::map<std::string, std::string>& digests) {
  std::error_code ec;
  size_t files = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    auto it = digests.find(name);
    if (it == digests.end()) return false;
    absl::StatusOr<std::string> digest = Sha256OfFile(entry.path().string());
    if (!digest.ok() || *digest != it->second) return false;
    ++files;
  }
  return !ec && files == digests.size();
}

}  // namespace

absl::StatusOr<std::string> FetchDataset(CoordinatorConnection& connection,
                                         const std::string& job_id, const std::string& dataset,
                                         const std::string& cache_dir) {
  if (!IsPlainFileName(dataset) || !IsPlainFileName(job_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset \"", dataset, "\" of job \"", job_id, "\" is not a folder name"));
  }
  const std::string data_dir = absl::StrCat(cache_dir, "/", job_id);
  const std::string final_dir = absl::StrCat(data_dir, "/", dataset);
  // A hidden folder per process: the dataset catalog passes over names starting with '.'.
  const std::string partial_dir = absl::StrCat(data_dir, "/.fetch-", getpid(), "-", dataset);
  std::error_code ec;
  fs::remove_all(partial_dir, ec);
  fs::create_directories(partial_dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot make the dataset cache folder ", partial_dir, ": ", ec.message()));
  }
  absl::StatusOr<std::map<std::string, std::string>> received =
      ReceiveFiles(connection, job_id, partial_dir);
  if (!received.ok()) {
    fs::remove_all(partial_dir, ec);
    return absl::Status(
        received.status().code(),
        absl::StrCat("fetching dataset \"", dataset, "\": ", received.status().message()));
  }
  // Ranks on one machine may share the cache: a copy that is already there and the same stays
  // (another rank may be reading it); anything else there (an older attempt's) is replaced.
  if (fs::exists(final_dir, ec) && HoldsTheSameFiles(final_dir, *received)) {
    fs::remove_all(partial_dir, ec);
    return data_dir;
  }
  const std::string stale_dir = absl::StrCat(data_dir, "/.stale-", getpid(), "-", dataset);
  fs::rename(final_dir, stale_dir, ec);  // fails harmlessly when there is none
  fs::rename(partial_dir, final_dir, ec);
  std::error_code ignored;
  fs::remove_all(stale_dir, ignored);
  if (ec) {
    fs::remove_all(partial_dir, ignored);
    return absl::InternalError(
        absl::StrCat("cannot move the fetched dataset into ", final_dir, ": ", ec.message()));
  }
  KILN_RETURN_IF_ERROR(SyncDirectory(data_dir));
  return data_dir;
}

}  // namespace kiln::worker
