#include "server/worker/worker_run.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "engine/backend_registry.h"
#include "engine/distributed/data_parallel.h"
#include "engine/distributed/timed_communicator.h"
#include "engine/trainer.h"
#include "server/checkpoints/checkpoint_policy.h"
#include "server/datasets/dataset_catalog.h"
#include "server/jobs/event_messages.h"
#include "server/jobs/job_data.h"
#include "server/jobs/job_vocabulary.h"
#include "server/jobs/spec_translation.h"
#include "server/jobs/training_run.h"
#include "server/worker/checkpoint_transfer.h"
#include "server/worker/coordinator_connection.h"
#include "server/worker/dataset_fetch.h"
#include "server/worker/grpc_key_value_store.h"
#include "server/worker/report_stream.h"

namespace kiln::worker {
namespace fs = std::filesystem;
namespace {

constexpr absl::Duration kJoinTimeout = absl::Seconds(30);
// How long kilnd may take to end the Report stream after the last report.
constexpr absl::Duration kCloseTimeout = absl::Seconds(10);
// When kilnd names none: the engine's own default for Gloo.
constexpr absl::Duration kDefaultCollectiveTimeout = absl::Seconds(60);

// The word rank 0 broadcasts after every step, so that every rank acts at the same step.
enum CommandBits : int32_t {
  kCheckpointBit = 1,  // write an on-demand checkpoint
  kCancelBit = 2,      // the job was cancelled
  kStopBit = 4,        // kilnd is shutting down
  kAbortBit = 8,       // rank 0 cannot go on (SIGTERM, lost its stream): stop, writing nothing
};

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

// kilnd checked the spec against its own limits (its --max_* flags) before the job ran; the
// worker must build what kilnd accepted, so it imposes none of its own.
server::SpecLimits AcceptedSpecLimits() {
  server::SpecLimits limits;
  limits.max_layers = std::numeric_limits<int>::max();
  limits.max_parameters = std::numeric_limits<int64_t>::max();
  limits.max_features = std::numeric_limits<int64_t>::max();
  limits.max_activation_bytes = std::numeric_limits<int64_t>::max();
  limits.max_job_memory_bytes = std::numeric_limits<int64_t>::max();
  limits.max_epochs = std::numeric_limits<int>::max();
  limits.max_batch_size = std::numeric_limits<int>::max();
  return limits;
}

absl::Status WithContext(const absl::Status& status, const std::string& what) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
}

// Joins the job's current attempt. Workers may start before it takes workers (the job is still
// queued, kilnd is between attempts or restarting), so FAILED_PRECONDITION and UNAVAILABLE are
// asked again every second for flags.join_wait_seconds.
absl::StatusOr<v1::JoinJobResponse> JoinJob(CoordinatorConnection& connection,
                                            const WorkerFlags& flags,
                                            const std::atomic<bool>& terminate) {
  v1::JoinJobRequest request;
  request.set_job_id(flags.job);
  request.set_rank(flags.rank);
  request.set_host(HostName());
  const std::string what = absl::StrCat("rank ", flags.rank, ": joining job ", flags.job);
  const absl::Time give_up = absl::Now() + absl::Seconds(flags.join_wait_seconds);
  bool said_waiting = false;
  while (true) {
    v1::JoinJobResponse joined;
    auto context = connection.NewContext(kJoinTimeout);
    const grpc::Status status = connection.stub().JoinJob(context.get(), request, &joined);
    if (status.ok()) return joined;
    const bool retry = status.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
                       status.error_code() == grpc::StatusCode::UNAVAILABLE;
    if (!retry || absl::Now() >= give_up || terminate.load()) return FromGrpc(status, what);
    if (!said_waiting) {
      std::fprintf(stderr, "kiln-worker: %s: %s; asking again for up to %d s\n", what.c_str(),
                   status.error_message().c_str(), flags.join_wait_seconds);
      said_waiting = true;
    }
    absl::SleepFor(absl::Seconds(1));
  }
}

// Everything one training run of this rank holds; the run's rules are the TrainingRun's, this
// rank supplies what a worker does differently: reports go to kilnd over the Report stream, rank
// 0 broadcasts kilnd's commands so that every rank acts at the same step, and rank 0 alone writes
// checkpoints, handing them to kilnd.
class RankRun : private server::TrainingRunHost {
 public:
  RankRun(const WorkerFlags& flags, const std::atomic<bool>& terminate,
          CoordinatorConnection* connection, ReportStream* report,
          const v1::JoinJobResponse& joined)
      : flags_(flags),
        terminate_(terminate),
        connection_(connection),
        report_(report),
        joined_(joined),
        policy_(joined.spec().checkpoint_policy()) {}

  ~RankRun() override {
    std::error_code ec;
    if (!scratch_dir_.empty()) fs::remove_all(scratch_dir_, ec);
  }

  absl::Status Train();

 private:
  bool rank0() const { return flags_.rank == 0; }
  absl::StatusOr<server::JobData> LoadDataset(const TrainConfig& config);
  absl::StatusOr<std::unique_ptr<Communicator>> JoinPeers(Backend* backend);
  absl::Status ResumeOnRank0(Trainer& trainer);
  // Rank 0's reasons to stop every rank without a checkpoint, or empty.
  std::string Rank0AbortReason() const;
  absl::StatusOr<int32_t> BroadcastCommandWord(Backend* backend, int32_t word);
  // Reports that cannot be sent are kept in report_error_ and stop the run at the step's end
  // (rank 0 then tells its peers to stop too), so these never fail.
  void Send(const v1::WorkerReport& report);

  // TrainingRunHost.
  absl::Status OnStep(const StepEvent& step, int64_t samples, double seconds) override;
  absl::Status OnEpoch(const EpochEvent& epoch, bool improved, double best) override;
  absl::StatusOr<server::RunCommands> Commands(Trainer& trainer) override;
  // Rank 0 only (others write nothing): saves, hands the file to kilnd, deletes it.
  absl::Status WriteCheckpoint(Trainer& trainer, v1::CheckpointKind kind) override;
  void CheckpointFailed(v1::CheckpointKind kind, const absl::Status& error) override;
  bool HasCheckpointAt(int64_t global_step) override { return global_step == last_written_step_; }
  // kilnd ends the attempt at the first rank that reports how it ended; the others wait here
  // until rank 0's last checkpoint is stored, so that it is not refused.
  absl::Status BeforeStopping() override { return timed_->Barrier(); }
  // The next step's allreduce numbers start from here.
  void StepClockRestarted() override { timed_->Reset(); }

  const WorkerFlags& flags_;
  const std::atomic<bool>& terminate_;
  CoordinatorConnection* connection_;
  ReportStream* report_;
  const v1::JoinJobResponse& joined_;
  const server::CheckpointPolicy policy_;
  std::string scratch_dir_;  // rank 0's checkpoint files on their way to kilnd

  // What training holds, alive until the run is destroyed, so that the last report goes out
  // while the peers are still connected (kilnd then hears this rank's reason, not theirs of a
  // vanished peer). Declared so that each goes before what it uses.
  server::JobData data_;
  std::unique_ptr<Backend> backend_;
  Tensor command_word_;  // BroadcastCommandWord's staging in the backend's memory
  std::unique_ptr<TimedCommunicator> timed_;
  std::unique_ptr<Trainer> trainer_;
  absl::Status report_error_;  // from reports that could not be sent
  int64_t last_written_step_ = -1;
};

absl::StatusOr<server::JobData> RankRun::LoadDataset(const TrainConfig& config) {
  // The spec names it too; JoinJobResponse.dataset is the one kilnd resolved.
  const std::string& name =
      joined_.dataset().empty() ? joined_.spec().dataset() : joined_.dataset();
  std::string data_dir = flags_.data_dir;
  std::error_code ec;
  if (data_dir.empty() || !fs::is_directory(fs::path(data_dir) / name, ec)) {
    std::fprintf(stderr, "kiln-worker: rank %d: fetching dataset \"%s\" from kilnd into %s\n",
                 flags_.rank, name.c_str(), flags_.cache_dir.c_str());
    KILN_ASSIGN_OR_RETURN(data_dir, FetchDataset(*connection_, flags_.job, name, flags_.cache_dir));
  }
  absl::StatusOr<server::JobData> data =
      server::LoadJobData(server::DatasetCatalog(data_dir, 0), name, config);
  if (data.ok()) return data;
  return absl::Status(data.status().code(),
                      absl::StrCat(data.status().message(), " (from ", data_dir, ")"));
}

absl::StatusOr<std::unique_ptr<Communicator>> RankRun::JoinPeers(Backend* backend) {
  CommunicatorOptions options;
  options.timeout = joined_.collective_timeout_ms() > 0
                        ? absl::Milliseconds(joined_.collective_timeout_ms())
                        : kDefaultCollectiveTimeout;
  options.gloo_hostname = flags_.gloo_host;
  options.gloo_interface = flags_.gloo_interface;
  // A stuck NCCL abort may leave its kernels on the GPU: only ending the process frees it, and
  // kilnd then fails the attempt as for any worker that exits.
  options.on_stuck_abort = [rank = flags_.rank](const std::string& why) {
    std::fprintf(stderr, "kiln-worker rank %d: exiting: %s\n", rank, why.c_str());
    std::fflush(stderr);
    _exit(1);
  };
  GrpcKeyValueStore store(connection_, flags_.job);
  return CreateCommunicator(backend, &store, flags_.rank, joined_.world_size(), options);
}

absl::Status RankRun::ResumeOnRank0(Trainer& trainer) {
  const v1::Checkpoint& from = joined_.resume_from();
  if (!rank0() || from.id() == 0) return absl::OkStatus();
  const std::string path = absl::StrCat(scratch_dir_, "/resume-", from.id(), ".safetensors");
  KILN_RETURN_IF_ERROR(DownloadCheckpoint(*connection_, flags_.job, from, path));
  absl::Status loaded = trainer.LoadCheckpoint(path);
  std::error_code ec;
  fs::remove(path, ec);
  KILN_RETURN_IF_ERROR(WithContext(loaded, absl::StrCat("resuming from checkpoint ", from.id())));
  // Its position is written already: a run that ends there needs no final checkpoint.
  last_written_step_ = trainer.position().global_step;
  std::fprintf(stderr, "kiln-worker: rank 0: resumed from checkpoint %lld (step %lld)\n",
               static_cast<long long>(from.id()), static_cast<long long>(last_written_step_));
  return absl::OkStatus();
}

absl::Status RankRun::WriteCheckpoint(Trainer& trainer, v1::CheckpointKind kind) {
  if (!rank0()) return absl::OkStatus();
  const TrainingPosition& position = trainer.position();
  const std::string path = absl::StrCat(scratch_dir_, "/", server::CheckpointKindName(kind),
                                        "-step", position.global_step, ".safetensors");
  absl::Cleanup remove_file = [&] {
    std::error_code ec;
    fs::remove(path, ec);
  };
  const absl::Time start = absl::Now();
  KILN_RETURN_IF_ERROR(trainer.SaveCheckpoint(path));
  v1::WriteCheckpointHeader header;
  header.set_job_id(flags_.job);
  header.set_kind(kind);
  header.set_epochs_done(position.epochs_done);
  header.set_global_step(position.global_step);
  header.set_write_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  header.set_rank_token(joined_.rank_token());
  KILN_ASSIGN_OR_RETURN(v1::Checkpoint written, UploadCheckpoint(*connection_, header, path));
  last_written_step_ = position.global_step;
  std::fprintf(stderr, "kiln-worker: rank 0: wrote %s checkpoint %lld at step %lld\n",
               server::CheckpointKindName(kind).c_str(), static_cast<long long>(written.id()),
               static_cast<long long>(position.global_step));
  return absl::OkStatus();
}

void RankRun::CheckpointFailed(v1::CheckpointKind kind, const absl::Status& error) {
  std::fprintf(stderr, "kiln-worker: rank 0: %s checkpoint failed: %s\n",
               server::CheckpointKindName(kind).c_str(), std::string(error.message()).c_str());
}

std::string RankRun::Rank0AbortReason() const {
  if (terminate_.load()) return "rank 0 was stopped by a signal";
  if (report_->broken()) return absl::StrCat("rank 0: ", report_->broken_reason());
  if (!report_error_.ok()) return absl::StrCat("rank 0: ", report_error_.message());
  return "";
}

absl::StatusOr<int32_t> RankRun::BroadcastCommandWord(Backend* backend, int32_t word) {
  // Through the backend's memory: NCCL's collectives take device pointers only.
  if (command_word_.capacity_bytes() < sizeof(word)) {
    KILN_ASSIGN_OR_RETURN(command_word_, backend->Allocate(DType::kU8, {int64_t{sizeof(word)}}));
  }
  KILN_RETURN_IF_ERROR(backend->CopyFromHost(&word, sizeof(word), &command_word_));
  KILN_RETURN_IF_ERROR(timed_->Broadcast(command_word_.raw(), sizeof(word), 0));
  KILN_RETURN_IF_ERROR(backend->CopyToHost(command_word_, &word, sizeof(word)));
  return word;
}

absl::StatusOr<server::RunCommands> RankRun::Commands(Trainer& trainer) {
  // Another rank's own trouble stops it alone; its peers then fail at their next collective.
  if (!rank0()) {
    if (terminate_.load()) return absl::AbortedError("stopped by a signal");
    if (report_->broken()) return absl::UnavailableError(report_->broken_reason());
    KILN_RETURN_IF_ERROR(report_error_);
  }
  int32_t word = 0;
  std::string abort_reason;
  if (rank0()) {
    ReceivedCommands& commands = report_->commands();
    if (commands.checkpoint.exchange(false)) word |= kCheckpointBit;
    if (commands.cancel.load()) word |= kCancelBit;
    if (commands.stop.load()) word |= kStopBit;
    abort_reason = Rank0AbortReason();
    if (!abort_reason.empty()) word |= kAbortBit;
  }
  KILN_ASSIGN_OR_RETURN(word, BroadcastCommandWord(trainer.backend(), word));
  if (word & kAbortBit) {
    return absl::AbortedError(abort_reason.empty() ? "rank 0 stopped the job" : abort_reason);
  }
  server::RunCommands commands;
  commands.checkpoint = (word & kCheckpointBit) != 0;
  commands.cancel = (word & kCancelBit) != 0;
  commands.stop = (word & kStopBit) != 0;
  return commands;
}

void RankRun::Send(const v1::WorkerReport& report) {
  if (absl::Status s = report_->Send(report); !s.ok() && report_error_.ok()) report_error_ = s;
}

absl::Status RankRun::OnStep(const StepEvent& e, int64_t samples, double seconds) {
  v1::WorkerReport report;
  v1::WorkerStep* step = report.mutable_step();
  *step->mutable_metrics() = server::StepMetricsOf(e);
  step->set_samples(samples);
  step->set_seconds(seconds);
  step->set_rank_samples(SliceOf(samples, flags_.rank, joined_.world_size()).count);
  step->set_allreduce_seconds(timed_->allreduce_seconds());
  step->set_allreduce_bytes(timed_->allreduce_bytes());
  Send(report);
  if (joined_.step_delay_ms() > 0) absl::SleepFor(absl::Milliseconds(joined_.step_delay_ms()));
  return absl::OkStatus();
}

absl::Status RankRun::OnEpoch(const EpochEvent& e, bool, double) {
  if (!rank0()) return absl::OkStatus();
  v1::WorkerReport report;
  *report.mutable_epoch()->mutable_metrics() = server::EpochMetricsOf(e);
  Send(report);
  return absl::OkStatus();
}

absl::Status RankRun::Train() {
  if (rank0()) {
    scratch_dir_ = absl::StrCat(flags_.cache_dir, "/", flags_.job, "/.rank0-", getpid());
    std::error_code ec;
    fs::create_directories(scratch_dir_, ec);
    if (ec) {
      return absl::PermissionDeniedError(absl::StrCat("cannot make the checkpoint scratch folder ",
                                                      scratch_dir_, ": ", ec.message()));
    }
  }
  absl::StatusOr<TrainConfig> translated = TranslateSpec(joined_.spec(), AcceptedSpecLimits());
  KILN_RETURN_IF_ERROR(WithContext(translated.status(), "the job's spec"));
  TrainConfig config = *std::move(translated);
  config.epochs = joined_.epochs();  // more than the spec's after a resume with more epochs
  KILN_ASSIGN_OR_RETURN(data_, LoadDataset(config));

  BackendOptions backend_options;
  backend_options.threads = flags_.threads > 0 ? flags_.threads : joined_.cpu_threads();
  // From the spec every rank receives: the ranks of a job compute alike.
  backend_options.precision = config.precision;
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      CreateBackend(joined_.device(), backend_options);
  KILN_RETURN_IF_ERROR(WithContext(backend.status(), absl::StrCat("device ", joined_.device())));
  backend_ = *std::move(backend);

  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> peers, JoinPeers(backend_.get()));
  timed_ = std::make_unique<TimedCommunicator>(std::move(peers));
  config.communicator = timed_.get();
  std::fprintf(stderr, "kiln-worker: rank %d: met its %d peers (training on %s%s, precision %s)\n",
               flags_.rank, joined_.world_size() - 1, joined_.device().c_str(),
               backend_->kind() == DeviceKind::kCpu
                   ? absl::StrCat(", threads=", CpuBackendThreads(backend_options)).c_str()
                   : "",
               server::JobPrecisionText(joined_.spec().precision(), joined_.device()).c_str());

  KILN_ASSIGN_OR_RETURN(trainer_, server::CreateJobTrainer(config, backend_.get(), data_));
  KILN_RETURN_IF_ERROR(ResumeOnRank0(*trainer_));

  // The job's best so far comes from kilnd (Job.best_test_accuracy).
  server::TrainingRun run(policy_, config.batch_size, data_.TrainSize(),
                          joined_.best_test_accuracy(), this);
  KILN_RETURN_IF_ERROR(run.Run(*trainer_));
  return report_error_;
}

}  // namespace

absl::Status RunWorker(const WorkerFlags& flags, const std::atomic<bool>& terminate) {
  CoordinatorOptions options;
  options.address = flags.coordinator;
  options.token = flags.token;
  options.tls_ca = flags.tls_ca;
  options.tls_cert = flags.tls_cert;
  options.tls_key = flags.tls_key;
  options.tls_server_name = flags.tls_server_name;
  const std::string rank_name = absl::StrCat("rank ", flags.rank);
  absl::StatusOr<std::unique_ptr<CoordinatorConnection>> connection =
      CoordinatorConnection::Open(options);
  KILN_RETURN_IF_ERROR(WithContext(connection.status(), rank_name));

  KILN_ASSIGN_OR_RETURN(const v1::JoinJobResponse joined, JoinJob(**connection, flags, terminate));
  std::fprintf(stderr, "kiln-worker: rank %d joined job %s (attempt %d, %d ranks, device %s)\n",
               flags.rank, flags.job.c_str(), joined.attempt(), joined.world_size(),
               joined.device().c_str());

  absl::StatusOr<std::unique_ptr<ReportStream>> report =
      ReportStream::Open(connection->get(), flags.job, flags.rank, joined.rank_token());
  KILN_RETURN_IF_ERROR(WithContext(report.status(), rank_name));
  (*report)->StartKeepAlive(absl::Milliseconds(joined.keep_alive_interval_ms()));

  RankRun run(flags, terminate, connection->get(), report->get(), joined);
  absl::Status trained = run.Train();
  v1::WorkerReport last;
  if (trained.ok()) {
    last.mutable_done();
  } else {
    trained = WithContext(trained, rank_name);
    last.mutable_failed()->set_code(trained.raw_code());
    last.mutable_failed()->set_message(std::string(trained.message()));
  }
  absl::Status closed = (*report)->Close(last, kCloseTimeout);
  if (!trained.ok()) return trained;
  return WithContext(closed, absl::StrCat(rank_name, ": training finished, but telling kilnd"));
}

}  // namespace kiln::worker
