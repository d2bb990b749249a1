#include "server/grpc/training_service.h"

#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/grpc/call_auth.h"
#include "server/grpc/status_mapping.h"
#include "server/grpc/write_reactors.h"

namespace kiln::server {

namespace {

constexpr int kDefaultPageSize = 100;
constexpr int kMaxPageSize = 1000;
constexpr int kDefaultChunkBytes = 1 << 20;
constexpr int kMaxChunkBytes = 4 << 20;

template <typename T>
grpc::ServerUnaryReactor* FinishWith(grpc::CallbackServerContext* context, absl::StatusOr<T> result,
                                     T* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (result.ok()) *response = *std::move(result);
  reactor->Finish(ToGrpcStatus(result.status()));
  return reactor;
}

grpc::ServerUnaryReactor* FinishWithError(grpc::CallbackServerContext* context,
                                          const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

absl::Status RequireJobId(const std::string& job_id) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id: required");
  return absl::OkStatus();
}

// As RefusedWrite (write_reactors.h), for client-streaming calls: nothing is read.
template <typename T>
class RefusedRead : public grpc::ServerReadReactor<T> {
 public:
  explicit RefusedRead(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

// Streams a job's history, then its live events until the job ends, the client cancels, or the
// daemon shuts down. Writes are one at a time; the history is pulled a page at a time as writes
// complete, and new events wake it from the publishing thread.
class WatchReactor final : public StreamWriterReactor<v1::JobEvent> {
 public:
  WatchReactor(JobWatch watch, MetricBroadcaster* broadcaster, StreamSlots::Slot slot)
      : current_state_(std::move(watch.current_state)),
        history_(std::move(watch.history)),
        live_(std::move(watch.live)),
        broadcaster_(broadcaster),
        slot_(std::move(slot)) {
    std::lock_guard<std::mutex> lock(mu_);
    if (live_) live_->SetNotify([this] { OnEventAvailable(); });
    WriteLocked();
  }

  void OnDone() override {
    // After Unsubscribe no notify can be running or start, so deleting is safe.
    if (live_) broadcaster_->Unsubscribe(live_);
    delete this;
  }

 private:
  void OnEventAvailable() {
    std::lock_guard<std::mutex> lock(mu_);
    WriteLocked();
  }

  void WriteNextLocked() override {
    if (current_state_) {
      current_ = *std::move(current_state_);
      current_state_.reset();
    } else if (!history_ || !NextFromHistoryLocked()) {
      if (finished_locked()) return;  // the history could not be read
      if (!live_) {
        FinishLocked(grpc::Status::OK);
        return;
      }
      if (!live_->Pop(&current_)) {
        absl::Status closed;
        if (live_->Finished(&closed)) FinishLocked(ToGrpcStatus(closed));
        return;  // woken again by the next event
      }
    }
    StartWriteLocked(&current_);
  }

  // True with the next recorded event in current_; false once the history is done (dropped) or
  // could not be read (the stream then finishes with the error).
  bool NextFromHistoryLocked() {
    absl::StatusOr<bool> next = history_->Next(&current_);
    if (next.ok() && *next) return true;
    history_.reset();
    if (!next.ok()) FinishLocked(ToGrpcStatus(next.status()));
    return false;
  }

  std::optional<v1::JobEvent> current_state_;
  std::unique_ptr<EventReplay> history_;  // null once replayed
  std::shared_ptr<Subscription> live_;
  MetricBroadcaster* broadcaster_;
  StreamSlots::Slot slot_;
  v1::JobEvent current_;
};

// Writes the chunks of a checkpoint export; the core reads and hashes them.
class ExportReactor : public grpc::ServerWriteReactor<v1::CheckpointChunk> {
 public:
  ExportReactor(std::unique_ptr<CheckpointExport> source, StreamSlots::Slot slot)
      : source_(std::move(source)), slot_(std::move(slot)) {
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the stream broke"));
    } else if (source_->done()) {
      Finish(grpc::Status::OK);
    } else {
      WriteNext();
    }
  }
  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    if (absl::Status s = source_->Next(&chunk_); !s.ok()) {
      Finish(ToGrpcStatus(s));
      return;
    }
    StartWrite(&chunk_);
  }

  std::unique_ptr<CheckpointExport> source_;
  StreamSlots::Slot slot_;
  v1::CheckpointChunk chunk_;
};

// The engine's format for an upload header's; UNSPECIFIED is IDX, as before formats existed.
absl::StatusOr<DatasetFormat> UploadFormat(v1::DatasetFormat format) {
  switch (format) {
    case v1::DATASET_FORMAT_UNSPECIFIED:
    case v1::DATASET_FORMAT_IDX:
      return DatasetFormat::kIdx;
    case v1::DATASET_FORMAT_CIFAR10:
      return DatasetFormat::kCifar10;
    case v1::DATASET_FORMAT_CSV:
      return DatasetFormat::kCsv;
    case v1::DATASET_FORMAT_NPY:
      return DatasetFormat::kNpy;
    case v1::DATASET_FORMAT_TEXT:
      return DatasetFormat::kText;
    case v1::DATASET_FORMAT_TOKENS:
      return DatasetFormat::kTokens;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("header.format: ", static_cast<int>(format), " is not a known format"));
  }
}

CsvOptions UploadCsvOptions(const v1::CsvOptions& csv) {
  CsvOptions o;
  o.label_column = csv.label_column();
  if (csv.has_header()) o.header = csv.header() ? CsvHeader::kPresent : CsvHeader::kAbsent;
  o.test_fraction = csv.test_fraction();
  return o;
}

// Reads an upload: a header, then file chunks; commits only when the client half-closes. A read
// that fails because the call was cancelled (the client cancelled, died or lost its connection)
// ends the upload without publishing anything: the DatasetUpload's folder goes with it.
class UploadReactor : public grpc::ServerReadReactor<v1::UploadDatasetRequest> {
 public:
  UploadReactor(grpc::CallbackServerContext* context, JobAccess* jobs, Caller caller,
                const DatasetCatalog* datasets, v1::Dataset* response, StreamSlots::Slot slot)
      : context_(context),
        jobs_(jobs),
        caller_(std::move(caller)),
        datasets_(datasets),
        response_(response),
        slot_(std::move(slot)) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // gRPC marks the call cancelled before a read fails for that reason, so a failed read of
      // a live call is the client's half-close: the only end of the stream that commits.
      if (context_->IsCancelled()) {
        upload_.reset();
        Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                            "the upload was cancelled; nothing was published"));
        return;
      }
      if (!upload_) {
        Finish(ToGrpcStatus(absl::InvalidArgumentError("header: the upload sent no header")));
        return;
      }
      absl::StatusOr<v1::Dataset> dataset = jobs_->CommitUpload(caller_, name_, *upload_);
      upload_.reset();
      if (dataset.ok()) *response_ = *dataset;
      Finish(ToGrpcStatus(dataset.status()));
      return;
    }
    absl::Status status;
    if (request_.has_header()) {
      if (upload_) {
        status = absl::InvalidArgumentError("header: sent twice");
      } else {
        const v1::UploadDatasetHeader& header = request_.header();
        const auto& files = header.files();
        name_ = header.name();
        absl::StatusOr<DatasetFormat> format = UploadFormat(header.format());
        if (format.ok()) {
          if (absl::Status allowed = jobs_->AuthorizeUpload(caller_, name_); !allowed.ok()) {
            format = allowed;
          }
        }
        absl::StatusOr<std::unique_ptr<DatasetUpload>> upload =
            format.ok()
                ? datasets_->BeginUpload(
                      header.name(), std::vector<std::string>(files.begin(), files.end()), *format,
                      UploadCsvOptions(header.csv()),
                      // Unset (0) is nanoGPT's split; the catalog checks the range.
                      header.val_fraction() == 0 ? kDefaultValFraction : header.val_fraction())
                : absl::StatusOr<std::unique_ptr<DatasetUpload>>(format.status());
        if (upload.ok()) upload_ = *std::move(upload);
        status = upload.status();
      }
    } else if (request_.has_chunk()) {
      status = upload_ ? upload_->Append(request_.chunk())
                       : absl::InvalidArgumentError("header: must be the first message");
    } else {
      status = absl::InvalidArgumentError("part: a message must carry a header or a chunk");
    }
    if (!status.ok()) {
      upload_.reset();  // stops at the first error; what was received goes now
      Finish(ToGrpcStatus(status));
      return;
    }
    StartRead(&request_);
  }
  void OnDone() override { delete this; }

 private:
  grpc::CallbackServerContext* context_;
  JobAccess* jobs_;
  const Caller caller_;
  const DatasetCatalog* datasets_;
  v1::Dataset* response_;
  std::string name_;  // the header's
  StreamSlots::Slot slot_;
  v1::UploadDatasetRequest request_;
  std::unique_ptr<DatasetUpload> upload_;
};

}  // namespace

grpc::ServerUnaryReactor* TrainingService::SubmitJob(grpc::CallbackServerContext* context,
                                                     const v1::SubmitJobRequest* request,
                                                     v1::Job* response) {
  absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return FinishWithError(context, caller.status());
  if (!request->has_spec()) {
    return FinishWithError(context, absl::InvalidArgumentError("spec: required"));
  }
  return FinishWith(context, jobs_->Submit(*caller, request->spec()), response);
}

grpc::ServerUnaryReactor* TrainingService::GetJob(grpc::CallbackServerContext* context,
                                                  const v1::GetJobRequest* request,
                                                  v1::Job* response) {
  absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return FinishWithError(context, caller.status());
  if (absl::Status s = RequireJobId(request->job_id()); !s.ok()) {
    return FinishWithError(context, s);
  }
  return FinishWith(context, jobs_->Get(*caller, request->job_id()), response);
}

grpc::ServerUnaryReactor* TrainingService::GetWorkerToken(grpc::CallbackServerContext* context,
                                                          const v1::GetWorkerTokenRequest* request,
                                                          v1::GetWorkerTokenResponse* response) {
  absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return FinishWithError(context, caller.status());
  if (absl::Status s = RequireJobId(request->job_id()); !s.ok()) {
    return FinishWithError(context, s);
  }
  absl::StatusOr<std::string> token = jobs_->WorkerToken(*caller, request->job_id());
  if (!token.ok()) return FinishWithError(context, token.status());
  v1::GetWorkerTokenResponse answer;
  answer.set_token(*std::move(token));
  return FinishWith(context, absl::StatusOr<v1::GetWorkerTokenResponse>(std::move(answer)),
                    response);
}

grpc::ServerUnaryReactor* TrainingService::ListJobs(grpc::CallbackServerContext* context,
                                                    const v1::ListJobsRequest* request,
                                                    v1::ListJobsResponse* response) {
  absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return FinishWithError(context, caller.status());
  int page_size = request->page_size() == 0 ? kDefaultPageSize : request->page_size();
  if (page_size < 1 || page_size > kMaxPageSize) {
    return FinishWithError(
        context, absl::InvalidArgumentError(absl::StrCat("page_size: must be in [0, ", kMaxPageSize,
                                                         "], got ", request->page_size())));
  }
  std::vector<v1::JobState> states;
  for (int state : request->states()) {
    if (state == v1::JOB_STATE_UNSPECIFIED || !v1::JobState_IsValid(state)) {
      return FinishWithError(
          context, absl::InvalidArgumentError(absl::StrCat("states: invalid state ", state)));
    }
    states.push_back(static_cast<v1::JobState>(state));
  }
  absl::StatusOr<JobPage> page = jobs_->List(*caller, states, page_size, request->page_token());
  if (page.ok()) {
    for (v1::Job& job : page->jobs) *response->add_jobs() = std::move(job);
    response->set_next_page_token(page->next_page_token);
  }
  return FinishWithError(context, page.status());
}

grpc::ServerUnaryReactor* TrainingService::CancelJob(grpc::CallbackServerContext* context,
                                                     const v1::CancelJobRequest* request,
                                                     v1::Job* response) {
  absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return FinishWithError(context, caller.status());
  if (absl::Status s = RequireJobId(request->job_id()); !s.ok()) {
    return FinishWithError(context, s);
  }
  return FinishWith(context, jobs_->Cancel(*caller, request->job_id()), response);
}

grpc::ServerUnaryReactor* TrainingService::ResumeJob(grpc::CallbackServerContext* context,
                                                     const v1::ResumeJobRequest* request,
                                                     v1::Job* response) {
  absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return FinishWithError(context, caller.status());
  if (absl::Status s = RequireJobId(request->job_id()); !s.ok()) {
    return FinishWithError(context, s);
  }
  if (request->checkpoint_id() < 0) {
    return FinishWithError(context, absl::InvalidArgumentError(absl::StrCat(
                                        "checkpoint_id: must be 0 (the newest) or an id from "
                                        "ListCheckpoints, got ",
                                        request->checkpoint_id())));
  }
  return FinishWith(
      context,
      jobs_->Resume(*caller, request->job_id(), request->epochs(), request->checkpoint_id()),
      response);
}

grpc::ServerWriteReactor<v1::JobEvent>* TrainingService::WatchJob(
    grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) {
  absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return new RefusedWrite<v1::JobEvent>(caller.status());
  if (absl::Status s = RequireJobId(request->job_id()); !s.ok()) {
    return new RefusedWrite<v1::JobEvent>(s);
  }
  absl::StatusOr<StreamSlots::Slot> slot = streams_.Acquire();
  if (!slot.ok()) return new RefusedWrite<v1::JobEvent>(slot.status());
  absl::StatusOr<JobWatch> watch =
      jobs_->Watch(*caller, request->job_id(), request->include_steps(), request->live_only());
  if (!watch.ok()) return new RefusedWrite<v1::JobEvent>(watch.status());
  return new WatchReactor(*std::move(watch), broadcaster_, *std::move(slot));
}

grpc::ServerUnaryReactor* TrainingService::CreateCheckpoint(
    grpc::CallbackServerContext* context, const v1::CreateCheckpointRequest* request,
    v1::Checkpoint* response) {
  absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return FinishWithError(context, caller.status());
  if (absl::Status s = RequireJobId(request->job_id()); !s.ok()) {
    return FinishWithError(context, s);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Answered from the training thread once the checkpoint is on disk.
  jobs_->RequestCheckpoint(*caller, request->job_id(),
                           [reactor, response](absl::StatusOr<v1::Checkpoint> c) {
                             if (c.ok()) *response = *std::move(c);
                             reactor->Finish(ToGrpcStatus(c.status()));
                           });
  return reactor;
}

grpc::ServerUnaryReactor* TrainingService::ListCheckpoints(
    grpc::CallbackServerContext* context, const v1::ListCheckpointsRequest* request,
    v1::ListCheckpointsResponse* response) {
  absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return FinishWithError(context, caller.status());
  if (absl::Status s = RequireJobId(request->job_id()); !s.ok()) {
    return FinishWithError(context, s);
  }
  absl::StatusOr<std::vector<v1::Checkpoint>> list =
      jobs_->ListCheckpoints(*caller, request->job_id());
  if (list.ok()) {
    for (v1::Checkpoint& c : *list) *response->add_checkpoints() = std::move(c);
  }
  return FinishWithError(context, list.status());
}

grpc::ServerUnaryReactor* TrainingService::DeleteCheckpoint(
    grpc::CallbackServerContext* context, const v1::DeleteCheckpointRequest* request,
    v1::Checkpoint* response) {
  absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return FinishWithError(context, caller.status());
  if (absl::Status s = RequireJobId(request->job_id()); !s.ok()) {
    return FinishWithError(context, s);
  }
  if (request->checkpoint_id() <= 0) {
    return FinishWithError(context, absl::InvalidArgumentError(absl::StrCat(
                                        "checkpoint_id: name the checkpoint to delete (an id "
                                        "from ListCheckpoints), got ",
                                        request->checkpoint_id())));
  }
  return FinishWith(context,
                    jobs_->DeleteCheckpoint(*caller, request->job_id(), request->checkpoint_id()),
                    response);
}

grpc::ServerWriteReactor<v1::CheckpointChunk>* TrainingService::ExportCheckpoint(
    grpc::CallbackServerContext* context, const v1::ExportCheckpointRequest* request) {
  absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return new RefusedWrite<v1::CheckpointChunk>(caller.status());
  if (absl::Status s = RequireJobId(request->job_id()); !s.ok()) {
    return new RefusedWrite<v1::CheckpointChunk>(s);
  }
  const int chunk = request->chunk_size() == 0 ? kDefaultChunkBytes : request->chunk_size();
  if (chunk < 1 || chunk > kMaxChunkBytes) {
    return new RefusedWrite<v1::CheckpointChunk>(absl::InvalidArgumentError(absl::StrCat(
        "chunk_size: must be in [0, ", kMaxChunkBytes, "], got ", request->chunk_size())));
  }
  absl::StatusOr<std::unique_ptr<CheckpointExport>> source =
      jobs_->ExportCheckpoint(*caller, request->job_id(), request->checkpoint_id(), chunk);
  if (!source.ok()) return new RefusedWrite<v1::CheckpointChunk>(source.status());
  absl::StatusOr<StreamSlots::Slot> slot = streams_.Acquire();
  if (!slot.ok()) return new RefusedWrite<v1::CheckpointChunk>(slot.status());
  return new ExportReactor(*std::move(source), *std::move(slot));
}

grpc::ServerUnaryReactor* TrainingService::ListDatasets(grpc::CallbackServerContext* context,
                                                        const v1::ListDatasetsRequest* /*request*/,
                                                        v1::ListDatasetsResponse* response) {
  absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return FinishWithError(context, caller.status());
  absl::StatusOr<std::vector<v1::Dataset>> list = jobs_->ListDatasets(*caller);
  if (list.ok()) {
    for (v1::Dataset& d : *list) *response->add_datasets() = std::move(d);
  }
  return FinishWithError(context, list.status());
}

grpc::ServerUnaryReactor* TrainingService::DeleteDataset(grpc::CallbackServerContext* context,
                                                         const v1::DeleteDatasetRequest* request,
                                                         v1::DeleteDatasetResponse* /*response*/) {
  absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return FinishWithError(context, caller.status());
  if (request->name().empty()) {
    return FinishWithError(context, absl::InvalidArgumentError("name: required"));
  }
  return FinishWithError(context, jobs_->DeleteDataset(*caller, request->name()));
}

grpc::ServerReadReactor<v1::UploadDatasetRequest>* TrainingService::UploadDataset(
    grpc::CallbackServerContext* context, v1::Dataset* response) {
  absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return new RefusedRead<v1::UploadDatasetRequest>(caller.status());
  absl::StatusOr<StreamSlots::Slot> slot = streams_.Acquire();
  if (!slot.ok()) return new RefusedRead<v1::UploadDatasetRequest>(slot.status());
  return new UploadReactor(context, jobs_, *std::move(caller), datasets_, response,
                           *std::move(slot));
}

grpc::ServerUnaryReactor* TrainingService::WhoAmI(grpc::CallbackServerContext* context,
                                                  const v1::WhoAmIRequest* /*request*/,
                                                  v1::WhoAmIResponse* response) {
  absl::StatusOr<Caller> caller = CallerOf(*context);
  if (!caller.ok()) return FinishWithError(context, caller.status());
  v1::WhoAmIResponse answer;
  answer.set_user(caller->user);
  answer.set_team(caller->team);
  answer.set_role(std::string(RoleName(caller->role)));
  answer.set_auth(auth_);
  return FinishWith(context, absl::StatusOr<v1::WhoAmIResponse>(std::move(answer)), response);
}

}  // namespace kiln::server
