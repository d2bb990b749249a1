// The jobs core (JobManager, DatasetCatalog) as one caller may see and change it: the access
// rules applied (access_rules.h), the caller recorded as the owner of what it makes, and every
// change audited (audit_log.h). kilnd's front ends (kiln.v1.Training, the web page's API) call
// this, never the manager, so each rule holds the same on every protocol.
//
// A job or dataset of another team answers as one that does not exist (the same NotFound); one
// the caller sees but may not change is PermissionDenied naming why.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kiln/v1/training.pb.h"
#include "server/access/access_rules.h"
#include "server/access/audit_log.h"
#include "server/datasets/dataset_catalog.h"
#include "server/jobs/job_manager.h"

namespace kiln::server {

struct JobAccessOptions {
  // What one team may store, its uploaded datasets and its jobs' checkpoints together
  // (--team_max_storage_bytes; 0: no limit). Past it, uploads, submissions and resumes of that
  // team are RESOURCE_EXHAUSTED naming the quota; running jobs go on.
  int64_t team_max_storage_bytes = 0;
  // Called for each call a team quota refused, with the team: kiln_quota_refusals_total.
  std::function<void(const std::string& team)> on_storage_refusal;
};

// Thread-safe. The manager, the catalog and the audit log must outlive it.
class JobAccess {
 public:
  JobAccess(JobManager* manager, const DatasetCatalog* datasets, AuditLog* audit,
            JobAccessOptions options = {})
      : manager_(manager), datasets_(datasets), audit_(audit), options_(std::move(options)) {}

  absl::StatusOr<v1::Job> Submit(const Caller& caller, const v1::JobSpec& spec);
  absl::StatusOr<v1::Job> Get(const Caller& caller, const std::string& job_id);
  // The caller's team's jobs and those of no team; every job for an admin.
  absl::StatusOr<JobPage> List(const Caller& caller, const std::vector<v1::JobState>& states,
                               int page_size, const std::string& page_token);
  absl::StatusOr<v1::Job> Cancel(const Caller& caller, const std::string& job_id);
  absl::StatusOr<v1::Job> Resume(const Caller& caller, const std::string& job_id, int epochs,
                                 int64_t checkpoint_id);
  absl::StatusOr<JobWatch> Watch(const Caller& caller, const std::string& job_id,
                                 bool include_steps, bool live_only);
  // `done` runs once, as JobManager::RequestCheckpoint's (at once when refused).
  void RequestCheckpoint(const Caller& caller, const std::string& job_id, CheckpointDone done);
  absl::StatusOr<std::vector<v1::Checkpoint>> ListCheckpoints(const Caller& caller,
                                                              const std::string& job_id);
  absl::StatusOr<v1::Checkpoint> DeleteCheckpoint(const Caller& caller, const std::string& job_id,
                                                  int64_t checkpoint_id);
  absl::StatusOr<std::unique_ptr<CheckpointExport>> ExportCheckpoint(const Caller& caller,
                                                                     const std::string& job_id,
                                                                     int64_t checkpoint_id,
                                                                     int chunk_bytes);
  absl::StatusOr<std::string> WorkerToken(const Caller& caller, const std::string& job_id);
  // Whether the caller may deploy a checkpoint of the job `source` names ("JOB", "JOB@best",
  // "JOB@17"): NotFound for a job it does not see, PermissionDenied for one it may not change;
  // OK for a source that names no job (the model repository refuses it). Not audited: the
  // deployment is, with its outcome.
  absl::Status MayDeployFrom(const Caller& caller, const std::string& source);
  // Whether the caller sees the job (as Get would answer it rather than NOT_FOUND).
  bool SeesJob(const Caller& caller, const std::string& job_id);
  // Whether the caller sees a model version served from `source` (its pinned "JOB@17"): it sees
  // the job. A model with no version in memory (empty source) only an admin sees.
  bool SeesModelSource(const Caller& caller, const std::string& source);

  // The datasets the caller sees: its team's and those of no team (every one for an admin).
  absl::StatusOr<std::vector<v1::Dataset>> ListDatasets(const Caller& caller);
  absl::Status DeleteDataset(const Caller& caller, const std::string& name);
  // Whether the caller may upload at all (its role), audited when not; the upload's name is
  // checked by the catalog, and the caller recorded as its owner by CommitUpload.
  absl::Status AuthorizeUpload(const Caller& caller, const std::string& name);
  absl::StatusOr<v1::Dataset> CommitUpload(const Caller& caller, const std::string& name,
                                           DatasetUpload& upload);

 private:
  // The team of the job's owner when the caller sees the job; JobNotFound otherwise, as for a
  // job that does not exist. Looks up the team alone: it runs on every call naming a job, and
  // on every inference (SeesModelSource).
  absl::StatusOr<std::string> VisibleTeam(const Caller& caller, const std::string& job_id);
  // Visible, then AuthorizeOn for `action`; audited when refused.
  absl::Status MayChangeJob(const Caller& caller, Action action, const std::string& job_id);
  // OK while the caller's team stores no more than its quota with `adding` more bytes;
  // ResourceExhausted naming the quota and what the team stores otherwise.
  absl::Status CheckStorage(const Caller& caller, int64_t adding);
  // `outcome`, audited.
  template <typename T>
  T Audited(const Caller& caller, Action action, const std::string& object, T outcome);

  JobManager* const manager_;
  const DatasetCatalog* const datasets_;
  AuditLog* const audit_;
  const JobAccessOptions options_;
};

}  // namespace kiln::server
