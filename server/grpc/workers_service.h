// kiln.v1.Workers (proto/kiln/v1/worker.proto): a thin translator between a job's kiln-worker
// processes and its attempt (server/jobs/worker_attempt.h). Over gRPC's synchronous API but for
// GetKey: a worker's report stream holds a thread for its life, a few per running job; a
// rendezvous wait, which any holder of the job's token can open, holds none (a callback
// reactor) and ends when its call is cancelled. Every call presents the job's worker token
// (metadata x-kiln-worker-token); kilnd's user bearer tokens are not asked for here.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/v1/worker.grpc.pb.h"
#include "server/datasets/dataset_catalog.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/worker_attempt.h"

namespace kiln::server {

inline constexpr char kWorkerTokenHeader[] = "x-kiln-worker-token";
inline constexpr char kWorkersMethodPrefix[] = "/kiln.v1.Workers/";

class WorkersService final : public v1::Workers::WithCallbackMethod_GetKey<v1::Workers::Service> {
 public:
  // `max_checkpoint_bytes` bounds a checkpoint rank 0 hands over.
  WorkersService(WorkerRegistry* registry, JobManager* manager, const DatasetCatalog* datasets,
                 std::string state_dir, int64_t max_checkpoint_bytes)
      : registry_(registry),
        manager_(manager),
        datasets_(datasets),
        state_dir_(std::move(state_dir)),
        max_checkpoint_bytes_(max_checkpoint_bytes) {}

  grpc::Status JoinJob(grpc::ServerContext* context, const v1::JoinJobRequest* request,
                       v1::JoinJobResponse* response) override;
  grpc::Status SetKey(grpc::ServerContext* context, const v1::SetKeyRequest* request,
                      v1::SetKeyResponse* response) override;
  grpc::ServerUnaryReactor* GetKey(grpc::CallbackServerContext* context,
                                   const v1::GetKeyRequest* request,
                                   v1::GetKeyResponse* response) override;
  grpc::Status Report(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::WorkerCommand, v1::WorkerReport>* stream) override;
  grpc::Status ReadCheckpoint(grpc::ServerContext* context,
                              const v1::ReadCheckpointRequest* request,
                              grpc::ServerWriter<v1::CheckpointChunk>* writer) override;
  grpc::Status WriteCheckpoint(grpc::ServerContext* context,
                               grpc::ServerReader<v1::WriteCheckpointRequest>* reader,
                               v1::Checkpoint* response) override;
  grpc::Status ReadDataset(grpc::ServerContext* context, const v1::ReadDatasetRequest* request,
                           grpc::ServerWriter<v1::DatasetFileChunk>* writer) override;

 private:
  // The job's running attempt, if the call's token is the job's.
  absl::StatusOr<std::shared_ptr<WorkerAttempt>> Attempt(grpc::ServerContextBase* context,
                                                         const std::string& job_id);

  WorkerRegistry* registry_;
  JobManager* manager_;
  const DatasetCatalog* datasets_;
  const std::string state_dir_;
  const int64_t max_checkpoint_bytes_;
};

}  // namespace kiln::server
