// inference.GRPCInferenceService (KServe v2 plus the model-repository extension) over gRPC's sync
// API: a thin translator that checks requests, calls the model repository and the batchers, and
// maps absl::Status to grpc::Status.
//
// Served models take one input, "input": FP32 (pixels scaled to [0, 1]) or UINT8 (raw pixels
// 0..255), typed or in raw_input_contents, shape [batch, ...] with the model's per-sample element
// count; ModelMetadata reports it as FP32 [-1, ...input shape]. They answer "probabilities" (FP32
// [batch, classes]) and "class" (INT64 [batch]), typed, or raw when the input was raw.
// A language model (a GPT) takes token ids instead, INT64 or INT32 [batch, length <= T]
// (metadata: INT64 [-1, -1]), and answers "logits" (FP32 [batch, vocab]) at each prompt's last
// position (server/serving/token_codec.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "inference/grpc_service.grpc.pb.h"
#include "server/access/access_rules.h"
#include "server/serving/model_repository.h"

namespace kiln::serving {

// One loaded version as the load request that brings it back after a restart: "checkpoint"
// pinned to the same file (e.g. "JOB@17" for "JOB@best"), "version" its label, and its device,
// threads and batching.
struct DeploymentRecord {
  std::string model, version;
  inference::RepositoryModelLoadRequest request;
  // An earlier start stopped while it was loading this record (killed, e.g. out of memory):
  // Restore does not load it again.
  bool restore_interrupted = false;
};

// Where Restore is with one record (InferenceServiceOptions::note_restore).
enum class RestorePhase {
  kLoading,  // about to load it
  kSettled,  // it loaded, or failed with a status (then it is marked unavailable)
};

// The reason a record with restore_interrupted is marked unavailable with.
inline constexpr char kInterruptedRestoreReason[] =
    "kilnd stopped while restoring it at an earlier start (out of memory?); not restored again: "
    "load it again, or unload it";

// The RepositoryModelLoad that deploys `source` as `model` with `options` (checkpoint, device,
// threads, precision and batching): what a recorded deployment replays and what following a job
// sends.
inference::RepositoryModelLoadRequest LoadRequestFor(const std::string& model,
                                                     const std::string& source,
                                                     const DeploymentOptions& options);

struct InferenceServiceOptions {
  std::string server_name = "kiln";
  std::string server_version;           // empty: kiln's own version
  int64_t max_request_samples = 16384;  // the largest batch one ModelInfer may carry
  // What RepositoryModelLoad deploys with, for the parameters a request does not give.
  DeploymentOptions default_deployment;
  // Called once per ModelInfer with its outcome, latency, queue time and batch size (0 when it
  // never ran), and after each load/unload; for the daemon's metrics and event log.
  std::function<void(const std::string& model, const std::string& version, absl::StatusCode code,
                     double seconds, double queue_seconds, int batch_size)>
      on_infer;
  // After a successful RepositoryModelLoad (source: its "checkpoint" parameter, or the model
  // name) or RepositoryModelUnload (source empty).
  std::function<void(const std::string& model, const std::string& source, bool loaded)>
      on_repository_change;
  // After each successful load or unload through this service: the model's loaded versions,
  // oldest first (empty: none), to make durable. An error fails the call (a load is undone).
  std::function<absl::Status(const std::string& model, const std::vector<DeploymentRecord>&)>
      record_deployments;
  // Before Restore loads a record and after it settled: for the daemon to note durably which
  // record is loading, so that a start killed while loading it does not load it again at the
  // next start (restore_interrupted), and die again.
  std::function<void(const DeploymentRecord&, RestorePhase)> note_restore;
  // Before a load by a caller whose role may deploy: OK when the caller may deploy from
  // `source` (the "checkpoint" parameter, e.g. "JOB@best"): NotFound for a job it does not see,
  // PermissionDenied for one it may not change. Unset: every source.
  std::function<absl::Status(const server::Caller&, const std::string& source)> check_source;
  // Each load and unload a caller asked for, with its outcome (refusals too): the audit log.
  std::function<void(const server::Caller&, server::Action, const std::string& object,
                     const absl::Status& outcome)>
      audit;
};

class InferenceService final : public inference::GRPCInferenceService::Service {
 public:
  // `repository` must outlive the service (and the grpc::Server it is registered on).
  explicit InferenceService(ModelRepository* repository, InferenceServiceOptions options = {});

  // What ServerReady answers (true from the start); e.g. false while the daemon shuts down.
  void SetReady(bool ready) { ready_.store(ready, std::memory_order_relaxed); }

  grpc::Status ServerLive(grpc::ServerContext* context, const inference::ServerLiveRequest* request,
                          inference::ServerLiveResponse* response) override;
  grpc::Status ServerReady(grpc::ServerContext* context,
                           const inference::ServerReadyRequest* request,
                           inference::ServerReadyResponse* response) override;
  // Ready is false, not an error, for an unknown or unloaded model or version.
  grpc::Status ModelReady(grpc::ServerContext* context, const inference::ModelReadyRequest* request,
                          inference::ModelReadyResponse* response) override;
  grpc::Status ServerMetadata(grpc::ServerContext* context,
                              const inference::ServerMetadataRequest* request,
                              inference::ServerMetadataResponse* response) override;
  grpc::Status ModelMetadata(grpc::ServerContext* context,
                             const inference::ModelMetadataRequest* request,
                             inference::ModelMetadataResponse* response) override;
  grpc::Status ModelInfer(grpc::ServerContext* context, const inference::ModelInferRequest* request,
                          inference::ModelInferResponse* response) override;
  // Lists loaded versions (READY) and unloaded models (UNAVAILABLE); repository_name is ignored:
  // kilnd has one repository.
  grpc::Status RepositoryIndex(grpc::ServerContext* context,
                               const inference::RepositoryIndexRequest* request,
                               inference::RepositoryIndexResponse* response) override;
  // Parameters: "checkpoint" (string: the model source; default: model_name), "version"
  // (string), "device" (string), "threads", "max_batch_size" and "max_queue_delay_us" (int64, or
  // a string holding one). Any other parameter is InvalidArgument.
  grpc::Status RepositoryModelLoad(grpc::ServerContext* context,
                                   const inference::RepositoryModelLoadRequest* request,
                                   inference::RepositoryModelLoadResponse* response) override;
  // Parameters: "version" (string: only that version or alias), "unload_dependents" (ignored).
  grpc::Status RepositoryModelUnload(grpc::ServerContext* context,
                                     const inference::RepositoryModelUnloadRequest* request,
                                     inference::RepositoryModelUnloadResponse* response) override;

  // The same calls without gRPC, for other transports (server/http), the daemon and tests. A
  // transport's handler calls these and nothing else, so every protocol answers alike. A model
  // the caller does not see (ModelRepositoryOptions::sees_source) is answered as an unknown one.
  bool Ready() const { return ready_.load(std::memory_order_relaxed); }
  // False, not an error, for an unknown or unloaded model or version; InvalidArgument for no name.
  absl::StatusOr<bool> ModelIsReady(const server::Caller& caller, const std::string& model,
                                    const std::string& version) const;
  void ServerInfo(inference::ServerMetadataResponse* response) const;
  void Index(const server::Caller& caller, const inference::RepositoryIndexRequest& request,
             inference::RepositoryIndexResponse* response) const;
  // Infer, and its outcome counted (on_infer) as ModelInfer counts it.
  absl::Status InferCounted(const server::Caller& caller,
                            const inference::ModelInferRequest& request,
                            inference::ModelInferResponse* response) const;
  // LoadModel / UnloadModel for `caller` (a member or admin: access_rules.h; the source checked
  // by check_source), announced (on_repository_change) as the RPCs announce them, and audited.
  // Whether `caller` may load into or unload `model`: OK when nothing is served under the name;
  // else the caller must see its newest version (another team's: NotFound on unload,
  // AlreadyExists on load) and may change the job it came from (check_source).
  absl::Status CheckModelName(const server::Caller& caller, const std::string& model,
                              bool loading) const;
  absl::Status LoadAnnounced(const server::Caller& caller,
                             const inference::RepositoryModelLoadRequest& request);
  absl::Status UnloadAnnounced(const server::Caller& caller,
                               const inference::RepositoryModelUnloadRequest& request);

  absl::Status Infer(const server::Caller& caller, const inference::ModelInferRequest& request,
                     inference::ModelInferResponse* response,
                     DynamicBatcher::RunInfo* info = nullptr) const;
  absl::Status Metadata(const server::Caller& caller,
                        const inference::ModelMetadataRequest& request,
                        inference::ModelMetadataResponse* response) const;
  absl::Status LoadModel(const inference::RepositoryModelLoadRequest& request);
  absl::Status UnloadModel(const inference::RepositoryModelUnloadRequest& request);

  // Loads recorded deployments again, in order, without recording them anew; one that fails is
  // marked unavailable in the repository with its reason (and stays recorded), and the rest
  // still load. A record with restore_interrupted is not loaded: it is marked unavailable with
  // kInterruptedRestoreReason until a load or unload of it. Returns the failures, as "model
  // version: reason".
  std::vector<std::string> Restore(const std::vector<DeploymentRecord>& records);

 private:
  // Infer for a language model: token ids in, the last position's logits out.
  absl::Status InferTokens(const ServedVersion& version,
                           const inference::ModelInferRequest& request,
                           inference::ModelInferResponse* response) const;
  // The records of `model`'s loaded versions, made from the repository (the one truth).
  std::vector<DeploymentRecord> RecordsOf(const std::string& model) const;

  ModelRepository* repository_;
  InferenceServiceOptions options_;
  // Serialises load/unload with their record, so records are written in the order of changes.
  std::mutex change_mu_;
  std::atomic<bool> ready_{true};
};

}  // namespace kiln::serving
