#include "server/grpc/workers_service.h"

#include <grpcpp/alarm.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/atomic_file.h"
#include "common/sha256.h"
#include "server/checkpoints/checkpoint_export.h"
#include "server/datasets/dataset_manifest.h"
#include "server/grpc/status_mapping.h"
#include "server/jobs/checkpoint_record.h"

namespace kiln::server {
namespace fs = std::filesystem;
namespace {

constexpr int kChunkBytes = 1 << 20;
// GetKey's longest wait: a rendezvous longer than this is a stuck job, not a slow one.
constexpr absl::Duration kMaxKeyWait = absl::Minutes(10);

std::string HeaderValue(grpc::ServerContextBase* context, const char* name) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(name);
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

// One GetKey waiting for its key without holding a thread. Whichever comes first finishes the
// call, once: the attempt (the key was set, or the attempt ended), the wait's alarm, or the
// call's cancellation (the worker went away, or its deadline passed).
class KeyWaitReactor final : public grpc::ServerUnaryReactor {
 public:
  static grpc::ServerUnaryReactor* Start(std::shared_ptr<WorkerAttempt> attempt, std::string key,
                                         absl::Duration wait, v1::GetKeyResponse* response) {
    auto* reactor = new KeyWaitReactor();
    auto state = std::make_shared<State>();
    state->reactor = reactor;
    state->response = response;
    state->attempt = std::move(attempt);
    reactor->state_ = state;
    absl::StatusOr<int64_t> id =
        state->attempt->WaitForKey(key, [state](absl::StatusOr<std::string> value) {
          state->Finish(std::move(value), /*attempt_done=*/true);
        });
    if (!id.ok()) state->Finish(id.status(), /*attempt_done=*/true);
    if (!id.ok() || *id == 0) return reactor;  // finished already
    {
      std::lock_guard<std::mutex> lock(state->mu);
      state->wait_id = *id;
    }
    const std::weak_ptr<State> weak = state;
    reactor->alarm_.Set(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(wait),
                        [weak, key, wait](bool expired) {
                          std::shared_ptr<State> s = weak.lock();
                          if (!expired || s == nullptr) return;  // cancelled: the call has finished
                          s->Finish(absl::DeadlineExceededError(absl::StrCat(
                                        "rendezvous key \"", key, "\" was not set within ",
                                        absl::FormatDuration(wait))),
                                    /*attempt_done=*/false);
                        });
    return reactor;
  }

  void OnCancel() override {
    state_->Finish(absl::CancelledError("the GetKey call was cancelled"), /*attempt_done=*/false);
  }
  void OnDone() override { delete this; }

 private:
  // What the attempt, the alarm and the reactor share; it outlives the reactor while the
  // attempt or the alarm may still call.
  struct State {
    std::mutex mu;
    bool finished = false;              // guarded; the reactor is not touched after
    grpc::ServerUnaryReactor* reactor;  // valid until finished
    v1::GetKeyResponse* response;       // gRPC's until the call finishes
    std::shared_ptr<WorkerAttempt> attempt;
    int64_t wait_id = 0;  // guarded; 0 until registered

    // `attempt_done`: the attempt has dropped the wait already (it called, or refused it).
    void Finish(absl::StatusOr<std::string> value, bool attempt_done) {
      grpc::ServerUnaryReactor* r;
      int64_t id;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (finished) return;
        finished = true;
        r = reactor;
        id = wait_id;
        if (value.ok()) response->set_value(*std::move(value));
      }
      // Outside the lock: Finish may run OnDone, which drops the alarm, which may call back.
      if (!attempt_done && id != 0) attempt->CancelKeyWait(id);
      r->Finish(value.ok() ? grpc::Status::OK : ToGrpcStatus(value.status()));
    }
  };

  KeyWaitReactor() = default;

  std::shared_ptr<State> state_;
  grpc::Alarm alarm_;  // destroyed with the reactor, which cancels it
};

}  // namespace

absl::StatusOr<std::shared_ptr<WorkerAttempt>> WorkersService::Attempt(
    grpc::ServerContextBase* context, const std::string& job_id) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id: required");
  const std::string token = HeaderValue(context, kWorkerTokenHeader);
  if (token.empty()) {
    return absl::UnauthenticatedError(absl::StrCat(
        "no worker token: send job ", job_id, "'s in the metadata header ", kWorkerTokenHeader));
  }
  return registry_->Find(job_id, token);
}

grpc::Status WorkersService::JoinJob(grpc::ServerContext* context,
                                     const v1::JoinJobRequest* request,
                                     v1::JoinJobResponse* response) {
  absl::StatusOr<std::shared_ptr<WorkerAttempt>> attempt = Attempt(context, request->job_id());
  if (!attempt.ok()) return ToGrpcStatus(attempt.status());
  absl::StatusOr<v1::JoinJobResponse> joined = (*attempt)->Join(request->rank(), request->host());
  if (!joined.ok()) return ToGrpcStatus(joined.status());
  *response = *std::move(joined);
  return grpc::Status::OK;
}

grpc::Status WorkersService::SetKey(grpc::ServerContext* context, const v1::SetKeyRequest* request,
                                    v1::SetKeyResponse*) {
  absl::StatusOr<std::shared_ptr<WorkerAttempt>> attempt = Attempt(context, request->job_id());
  if (!attempt.ok()) return ToGrpcStatus(attempt.status());
  return ToGrpcStatus((*attempt)->SetKey(request->key(), request->value()));
}

grpc::ServerUnaryReactor* WorkersService::GetKey(grpc::CallbackServerContext* context,
                                                 const v1::GetKeyRequest* request,
                                                 v1::GetKeyResponse* response) {
  absl::StatusOr<std::shared_ptr<WorkerAttempt>> attempt = Attempt(context, request->job_id());
  if (!attempt.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(attempt.status()));
    return reactor;
  }
  const absl::Duration wait =
      std::clamp(absl::Milliseconds(request->timeout_ms()), absl::ZeroDuration(), kMaxKeyWait);
  return KeyWaitReactor::Start(*std::move(attempt), request->key(), wait, response);
}

grpc::Status WorkersService::Report(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::WorkerCommand, v1::WorkerReport>* stream) {
  v1::WorkerReport first;
  if (!stream->Read(&first)) return grpc::Status::OK;
  if (!first.has_hello()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "a worker's first report must be hello (its rank and job)");
  }
  absl::StatusOr<std::shared_ptr<WorkerAttempt>> found = Attempt(context, first.hello().job_id());
  if (!found.ok()) return ToGrpcStatus(found.status());
  const std::shared_ptr<WorkerAttempt> attempt = *std::move(found);
  const int rank = first.hello().rank();
  // The stream speaks for the rank that joined, and only it.
  if (absl::Status s = attempt->CheckRankToken(rank, first.hello().rank_token()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  if (absl::Status s = attempt->Report(rank, first); !s.ok()) return ToGrpcStatus(s);

  // Commands go out on their own thread while this one reads (gRPC allows one of each at once).
  std::atomic<bool> reading{true};
  std::thread writer([&] {
    while (reading) {
      std::optional<v1::WorkerCommand> command = attempt->NextCommand(rank, absl::Seconds(1));
      if (command.has_value() && !stream->Write(*command)) break;
      if (!command.has_value() && attempt->State().ended) break;
    }
  });
  absl::Status status;
  bool ended_well = false;
  v1::WorkerReport report;
  while (stream->Read(&report)) {
    status = attempt->Report(rank, report);
    if (!status.ok()) {
      // The attempt fails for what was wrong, not for the stream that ends because of it.
      attempt->Fail(status);
      break;
    }
    if (report.has_done() || report.has_failed()) ended_well = true;
  }
  reading = false;
  writer.join();
  if (!ended_well) attempt->StreamEnded(rank);
  return ToGrpcStatus(status);
}

grpc::Status WorkersService::ReadCheckpoint(grpc::ServerContext* context,
                                            const v1::ReadCheckpointRequest* request,
                                            grpc::ServerWriter<v1::CheckpointChunk>* writer) {
  absl::StatusOr<std::shared_ptr<WorkerAttempt>> attempt = Attempt(context, request->job_id());
  if (!attempt.ok()) return ToGrpcStatus(attempt.status());
  if (!(*attempt)->StartsFrom(request->checkpoint_id())) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("checkpoint ", request->checkpoint_id(),
                                     " is not the one this attempt starts from"));
  }
  absl::StatusOr<std::unique_ptr<CheckpointExport>> file =
      manager_->ExportCheckpoint(request->job_id(), request->checkpoint_id(), kChunkBytes);
  if (!file.ok()) return ToGrpcStatus(file.status());
  while (!(*file)->done()) {
    v1::CheckpointChunk chunk;
    if (absl::Status s = (*file)->Next(&chunk); !s.ok()) return ToGrpcStatus(s);
    chunk.mutable_checkpoint()->clear_path();
    if (!writer->Write(chunk)) return grpc::Status(grpc::StatusCode::CANCELLED, "worker went away");
  }
  return grpc::Status::OK;
}

grpc::Status WorkersService::WriteCheckpoint(grpc::ServerContext* context,
                                             grpc::ServerReader<v1::WriteCheckpointRequest>* reader,
                                             v1::Checkpoint* response) {
  v1::WriteCheckpointRequest message;
  if (!reader->Read(&message) || !message.has_header()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "WriteCheckpoint's first message must carry the header");
  }
  const v1::WriteCheckpointHeader header = message.header();
  absl::StatusOr<std::shared_ptr<WorkerAttempt>> attempt = Attempt(context, header.job_id());
  if (!attempt.ok()) return ToGrpcStatus(attempt.status());
  // Rank 0's, of a kind and at a place the run writes one, before any byte is taken.
  absl::StatusOr<int64_t> most = (*attempt)->BeginCheckpoint(header);
  if (!most.ok()) return ToGrpcStatus(most.status());
  absl::Cleanup end_checkpoint = [&] { (*attempt)->EndCheckpoint(); };
  const int64_t limit = std::min(max_checkpoint_bytes_, *most);
  if (header.size_bytes() < 0 || header.size_bytes() > limit) {
    return grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("a checkpoint of ", header.size_bytes(), " bytes is over the limit of ", limit,
                     " bytes (",
                     limit == *most ? "the most a checkpoint of the job's model takes"
                                    : "--max_job_memory_bytes",
                     ")"));
  }
  const std::string path =
      NewCheckpointPath(state_dir_, header.job_id(), header.kind(), header.global_step());
  absl::StatusOr<std::unique_ptr<AtomicFileWriter>> file = AtomicFileWriter::Open(path);
  if (!file.ok()) return ToGrpcStatus(file.status());
  Sha256 sha;
  int64_t received = 0;
  do {
    received += static_cast<int64_t>(message.data().size());
    if (received > header.size_bytes()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("the checkpoint is longer than its header's ",
                                       header.size_bytes(), " bytes"));
    }
    sha.Update(message.data());
    if (absl::Status s = (*file)->Append(message.data()); !s.ok()) return ToGrpcStatus(s);
  } while (reader->Read(&message));
  if (received != header.size_bytes()) {
    return grpc::Status(grpc::StatusCode::DATA_LOSS,
                        absl::StrCat("the checkpoint ended at ", received, " of its ",
                                     header.size_bytes(), " bytes"));
  }
  if (sha.HexDigest() != header.sha256()) {
    return grpc::Status(grpc::StatusCode::DATA_LOSS,
                        "the checkpoint's bytes do not match its sha256; nothing was recorded");
  }
  if (absl::Status s = (*file)->Commit(); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<v1::Checkpoint> recorded = (*attempt)->RecordCheckpoint(header, path);
  if (!recorded.ok()) {
    std::error_code ec;
    fs::remove(path, ec);
    return ToGrpcStatus(recorded.status());
  }
  *response = *std::move(recorded);
  response->clear_path();
  return grpc::Status::OK;
}

grpc::Status WorkersService::ReadDataset(grpc::ServerContext* context,
                                         const v1::ReadDatasetRequest* request,
                                         grpc::ServerWriter<v1::DatasetFileChunk>* writer) {
  absl::StatusOr<std::shared_ptr<WorkerAttempt>> attempt = Attempt(context, request->job_id());
  if (!attempt.ok()) return ToGrpcStatus(attempt.status());
  const std::string folder = absl::StrCat(datasets_->data_dir(), "/", (*attempt)->dataset());
  std::error_code ec;
  std::vector<fs::path> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    // Data files and the manifest; hidden leftovers (temp files) are not the dataset's.
    if (!entry.is_regular_file() || (name.starts_with(".") && name != kDatasetManifestName)) {
      continue;
    }
    files.push_back(entry.path());
  }
  if (ec) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("dataset \"", (*attempt)->dataset(), "\": ", ec.message()));
  }
  std::sort(files.begin(), files.end());
  std::vector<char> buffer(kChunkBytes);
  for (const fs::path& path : files) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return grpc::Status(grpc::StatusCode::DATA_LOSS,
                          absl::StrCat("cannot read ", path.filename().string()));
    }
    Sha256 sha;
    while (true) {
      in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
      const std::streamsize n = in.gcount();
      v1::DatasetFileChunk chunk;
      chunk.set_file_name(path.filename().string());
      chunk.set_data(buffer.data(), static_cast<size_t>(n));
      sha.Update(chunk.data());
      const bool last = in.eof();
      if (!last && !in) {
        return grpc::Status(grpc::StatusCode::DATA_LOSS,
                            absl::StrCat("reading ", path.filename().string(), " failed"));
      }
      if (last) chunk.set_sha256(sha.HexDigest());
      if (!writer->Write(chunk)) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "worker went away");
      }
      if (last) break;
    }
  }
  return grpc::Status::OK;
}

}  // namespace kiln::server
