// kiln.v1.Training over gRPC's callback API: a thin translator that checks request fields,
// learns the caller (call_auth.h), calls the jobs core as that caller sees it (JobAccess), and
// maps absl::Status to grpc::Status.
#pragma once

#include "kiln/v1/training.grpc.pb.h"
#include "server/access/job_access.h"
#include "server/datasets/dataset_catalog.h"
#include "server/grpc/stream_slots.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/metric_broadcaster.h"

namespace kiln::server {

class TrainingService final : public v1::Training::CallbackService {
 public:
  // `max_streams`: streaming calls (WatchJob, ExportCheckpoint, UploadDataset) open at once.
  // `auth`: whether kilnd checks bearer tokens (WhoAmI says).
  TrainingService(JobAccess* jobs, const DatasetCatalog* datasets, MetricBroadcaster* broadcaster,
                  int max_streams, bool auth)
      : jobs_(jobs),
        datasets_(datasets),
        broadcaster_(broadcaster),
        streams_(max_streams),
        auth_(auth) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const v1::SubmitJobRequest* request,
                                      v1::Job* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request, v1::Job* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const v1::CancelJobRequest* request,
                                      v1::Job* response) override;
  grpc::ServerUnaryReactor* ResumeJob(grpc::CallbackServerContext* context,
                                      const v1::ResumeJobRequest* request,
                                      v1::Job* response) override;
  grpc::ServerWriteReactor<v1::JobEvent>* WatchJob(grpc::CallbackServerContext* context,
                                                   const v1::WatchJobRequest* request) override;
  grpc::ServerUnaryReactor* CreateCheckpoint(grpc::CallbackServerContext* context,
                                             const v1::CreateCheckpointRequest* request,
                                             v1::Checkpoint* response) override;
  grpc::ServerUnaryReactor* GetWorkerToken(grpc::CallbackServerContext* context,
                                           const v1::GetWorkerTokenRequest* request,
                                           v1::GetWorkerTokenResponse* response) override;
  grpc::ServerUnaryReactor* ListCheckpoints(grpc::CallbackServerContext* context,
                                            const v1::ListCheckpointsRequest* request,
                                            v1::ListCheckpointsResponse* response) override;
  grpc::ServerUnaryReactor* DeleteCheckpoint(grpc::CallbackServerContext* context,
                                             const v1::DeleteCheckpointRequest* request,
                                             v1::Checkpoint* response) override;
  grpc::ServerWriteReactor<v1::CheckpointChunk>* ExportCheckpoint(
      grpc::CallbackServerContext* context, const v1::ExportCheckpointRequest* request) override;
  grpc::ServerUnaryReactor* ListDatasets(grpc::CallbackServerContext* context,
                                         const v1::ListDatasetsRequest* request,
                                         v1::ListDatasetsResponse* response) override;
  grpc::ServerReadReactor<v1::UploadDatasetRequest>* UploadDataset(
      grpc::CallbackServerContext* context, v1::Dataset* response) override;
  grpc::ServerUnaryReactor* DeleteDataset(grpc::CallbackServerContext* context,
                                          const v1::DeleteDatasetRequest* request,
                                          v1::DeleteDatasetResponse* response) override;
  grpc::ServerUnaryReactor* WhoAmI(grpc::CallbackServerContext* context,
                                   const v1::WhoAmIRequest* request,
                                   v1::WhoAmIResponse* response) override;

 private:
  JobAccess* jobs_;
  const DatasetCatalog* datasets_;
  MetricBroadcaster* broadcaster_;
  StreamSlots streams_;
  const bool auth_;
};

}  // namespace kiln::server
