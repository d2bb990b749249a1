#include "server/access/job_access.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/byte_size.h"
#include "common/status_macros.h"

namespace kiln::server {
namespace {

const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

v1::Owner OwnerOf(const Caller& caller) {
  v1::Owner owner;
  owner.set_user(caller.user);
  owner.set_team(caller.team);
  return owner;
}

// The team an admin lists (every one: nullopt) or another caller's.
std::optional<std::string> ListedTeam(const Caller& caller) {
  if (caller.role == Role::kAdmin) return std::nullopt;
  return caller.team;
}

}  // namespace

template <typename T>
T JobAccess::Audited(const Caller& caller, Action action, const std::string& object, T outcome) {
  audit_->Record(caller, action, object, StatusOf(outcome));
  return outcome;
}

absl::Status JobAccess::CheckStorage(const Caller& caller, int64_t adding) {
  const int64_t quota = options_.team_max_storage_bytes;
  if (quota <= 0 || caller.team.empty()) return absl::OkStatus();
  KILN_ASSIGN_OR_RETURN(const int64_t checkpoints, manager_->CheckpointBytesOfTeam(caller.team));
  KILN_ASSIGN_OR_RETURN(const std::vector<v1::Dataset> all, datasets_->List());
  int64_t datasets = 0;
  for (const v1::Dataset& d : all) {
    if (d.owner().team() == caller.team) datasets += d.size_bytes();
  }
  const int64_t stored = checkpoints + datasets;
  // At the quota a job would still write checkpoints: refused too, not only past it.
  if (adding > 0 ? stored + adding <= quota : stored < quota) return absl::OkStatus();
  if (options_.on_storage_refusal) options_.on_storage_refusal(caller.team);
  return absl::ResourceExhaustedError(
      absl::StrCat("team ", caller.team, " stores ", FormatBytes(stored), " (datasets ",
                   FormatBytes(datasets), ", checkpoints ", FormatBytes(checkpoints), ")",
                   adding > 0 ? absl::StrCat(" and this upload adds ", FormatBytes(adding)) : "",
                   "; its quota is ", FormatBytes(quota),
                   " (--team_max_storage_bytes): delete datasets or checkpoints, or ask an admin"));
}

absl::StatusOr<std::string> JobAccess::VisibleTeam(const Caller& caller,
                                                   const std::string& job_id) {
  absl::StatusOr<std::string> team = manager_->OwnerTeam(job_id);
  if (team.ok() && !Sees(caller, *team)) return JobNotFound(job_id);
  return team;
}

bool JobAccess::SeesJob(const Caller& caller, const std::string& job_id) {
  return VisibleTeam(caller, job_id).ok();
}

absl::Status JobAccess::MayChangeJob(const Caller& caller, Action action,
                                     const std::string& job_id) {
  // The role first: a viewer is told what it may not do before whether the job exists.
  absl::Status allowed = Authorize(caller, action);
  if (allowed.ok()) {
    absl::StatusOr<std::string> team = VisibleTeam(caller, job_id);
    allowed = team.ok() ? AuthorizeOn(caller, action, *team) : team.status();
  }
  if (!allowed.ok()) audit_->Record(caller, action, job_id, allowed);
  return allowed;
}

absl::StatusOr<v1::Job> JobAccess::Submit(const Caller& caller, const v1::JobSpec& spec) {
  const std::string object = absl::StrCat("dataset ", spec.dataset());
  absl::Status allowed = Authorize(caller, Action::kSubmitJob);
  // A job no one may preempt holds its device against every priority: an admin's call.
  if (allowed.ok() && spec.non_preemptible() && caller.role != Role::kAdmin) {
    allowed = absl::PermissionDeniedError(
        absl::StrCat("spec.non_preemptible: only an admin may submit a job no one may preempt "
                     "(user \"",
                     caller.user, "\" is a ", std::string(RoleName(caller.role)), ")"));
  }
  if (allowed.ok()) allowed = CheckStorage(caller, 0);
  if (!allowed.ok()) {
    return Audited<absl::StatusOr<v1::Job>>(caller, Action::kSubmitJob, object, allowed);
  }
  // Another team's dataset is not there for this caller: refused as a missing one is.
  if (!spec.dataset().empty() && datasets_->Exists(spec.dataset()) &&
      !Sees(caller, datasets_->OwnerOf(spec.dataset()).team())) {
    return Audited<absl::StatusOr<v1::Job>>(
        caller, Action::kSubmitJob, object,
        absl::NotFoundError(
            absl::StrCat("spec.dataset: ", datasets_->NotFound(spec.dataset()).message())));
  }
  absl::StatusOr<v1::Job> job = manager_->Submit(spec, OwnerOf(caller));
  audit_->Record(caller, Action::kSubmitJob, job.ok() ? job->id() : object, job.status());
  return job;
}

absl::StatusOr<v1::Job> JobAccess::Get(const Caller& caller, const std::string& job_id) {
  KILN_RETURN_IF_ERROR(Authorize(caller, Action::kRead));
  KILN_RETURN_IF_ERROR(VisibleTeam(caller, job_id).status());
  return manager_->Get(job_id);
}

absl::StatusOr<JobPage> JobAccess::List(const Caller& caller,
                                        const std::vector<v1::JobState>& states, int page_size,
                                        const std::string& page_token) {
  KILN_RETURN_IF_ERROR(Authorize(caller, Action::kRead));
  return manager_->List(states, page_size, page_token, ListedTeam(caller));
}

absl::StatusOr<v1::Job> JobAccess::Cancel(const Caller& caller, const std::string& job_id) {
  KILN_RETURN_IF_ERROR(MayChangeJob(caller, Action::kCancelJob, job_id));
  return Audited(caller, Action::kCancelJob, job_id, manager_->Cancel(job_id));
}

absl::StatusOr<v1::Job> JobAccess::Resume(const Caller& caller, const std::string& job_id,
                                          int epochs, int64_t checkpoint_id) {
  KILN_RETURN_IF_ERROR(MayChangeJob(caller, Action::kResumeJob, job_id));
  if (absl::Status s = CheckStorage(caller, 0); !s.ok()) {
    return Audited<absl::StatusOr<v1::Job>>(caller, Action::kResumeJob, job_id, s);
  }
  return Audited(caller, Action::kResumeJob, job_id,
                 manager_->Resume(job_id, epochs, checkpoint_id));
}

absl::StatusOr<JobWatch> JobAccess::Watch(const Caller& caller, const std::string& job_id,
                                          bool include_steps, bool live_only) {
  KILN_RETURN_IF_ERROR(Authorize(caller, Action::kRead));
  KILN_RETURN_IF_ERROR(VisibleTeam(caller, job_id).status());
  return manager_->Watch(job_id, include_steps, live_only);
}

void JobAccess::RequestCheckpoint(const Caller& caller, const std::string& job_id,
                                  CheckpointDone done) {
  if (absl::Status s = MayChangeJob(caller, Action::kCreateCheckpoint, job_id); !s.ok()) {
    done(s);
    return;
  }
  // Audited when written (or not), on the thread that answers.
  manager_->RequestCheckpoint(
      job_id, [this, caller, job_id, done = std::move(done)](absl::StatusOr<v1::Checkpoint> c) {
        audit_->Record(caller, Action::kCreateCheckpoint, job_id, c.status());
        done(std::move(c));
      });
}

absl::StatusOr<std::vector<v1::Checkpoint>> JobAccess::ListCheckpoints(const Caller& caller,
                                                                       const std::string& job_id) {
  KILN_RETURN_IF_ERROR(Authorize(caller, Action::kRead));
  KILN_RETURN_IF_ERROR(VisibleTeam(caller, job_id).status());
  return manager_->ListCheckpoints(job_id);
}

absl::StatusOr<v1::Checkpoint> JobAccess::DeleteCheckpoint(const Caller& caller,
                                                           const std::string& job_id,
                                                           int64_t checkpoint_id) {
  KILN_RETURN_IF_ERROR(MayChangeJob(caller, Action::kDeleteCheckpoint, job_id));
  return Audited(caller, Action::kDeleteCheckpoint, absl::StrCat(job_id, "@", checkpoint_id),
                 manager_->DeleteCheckpoint(job_id, checkpoint_id));
}

absl::StatusOr<std::unique_ptr<CheckpointExport>> JobAccess::ExportCheckpoint(
    const Caller& caller, const std::string& job_id, int64_t checkpoint_id, int chunk_bytes) {
  KILN_RETURN_IF_ERROR(MayChangeJob(caller, Action::kExportCheckpoint, job_id));
  absl::StatusOr<std::unique_ptr<CheckpointExport>> source =
      manager_->ExportCheckpoint(job_id, checkpoint_id, chunk_bytes);
  audit_->Record(caller, Action::kExportCheckpoint, absl::StrCat(job_id, "@", checkpoint_id),
                 source.status());
  return source;
}

absl::StatusOr<std::string> JobAccess::WorkerToken(const Caller& caller,
                                                   const std::string& job_id) {
  KILN_RETURN_IF_ERROR(MayChangeJob(caller, Action::kGetWorkerToken, job_id));
  absl::StatusOr<std::string> token = manager_->WorkerToken(job_id);
  audit_->Record(caller, Action::kGetWorkerToken, job_id, token.status());  // never the token
  return token;
}

absl::Status JobAccess::MayDeployFrom(const Caller& caller, const std::string& source) {
  const std::string job_id = source.substr(0, source.find('@'));
  if (job_id.empty()) return absl::OkStatus();
  KILN_ASSIGN_OR_RETURN(const std::string team, VisibleTeam(caller, job_id));
  return AuthorizeOn(caller, Action::kDeploy, team);
}

bool JobAccess::SeesModelSource(const Caller& caller, const std::string& source) {
  if (caller.role == Role::kAdmin) return true;
  const std::string job_id = source.substr(0, source.find('@'));
  return !job_id.empty() && SeesJob(caller, job_id);
}

absl::StatusOr<std::vector<v1::Dataset>> JobAccess::ListDatasets(const Caller& caller) {
  KILN_RETURN_IF_ERROR(Authorize(caller, Action::kRead));
  KILN_ASSIGN_OR_RETURN(std::vector<v1::Dataset> all, datasets_->List());
  std::vector<v1::Dataset> seen;
  for (v1::Dataset& d : all) {
    if (Sees(caller, d.owner().team())) seen.push_back(std::move(d));
  }
  return seen;
}

absl::Status JobAccess::DeleteDataset(const Caller& caller, const std::string& name) {
  const std::string object = absl::StrCat("dataset ", name);
  absl::Status allowed = Authorize(caller, Action::kDeleteDataset);
  if (allowed.ok() && datasets_->Exists(name)) {
    const std::string team = datasets_->OwnerOf(name).team();
    allowed = Sees(caller, team) ? AuthorizeOn(caller, Action::kDeleteDataset, team)
                                 : datasets_->NotFound(name);
  }
  if (!allowed.ok()) return Audited(caller, Action::kDeleteDataset, object, allowed);
  return Audited(caller, Action::kDeleteDataset, object, manager_->DeleteDataset(name));
}

absl::Status JobAccess::AuthorizeUpload(const Caller& caller, const std::string& name) {
  absl::Status allowed = Authorize(caller, Action::kUploadDataset);
  if (allowed.ok()) allowed = CheckStorage(caller, 0);
  if (!allowed.ok()) audit_->Record(caller, Action::kUploadDataset, "dataset " + name, allowed);
  return allowed;
}

absl::StatusOr<v1::Dataset> JobAccess::CommitUpload(const Caller& caller, const std::string& name,
                                                    DatasetUpload& upload) {
  if (absl::Status s = CheckStorage(caller, upload.stored_bytes()); !s.ok()) {
    return Audited<absl::StatusOr<v1::Dataset>>(caller, Action::kUploadDataset, "dataset " + name,
                                                s);
  }
  upload.set_owner(OwnerOf(caller));
  return Audited(caller, Action::kUploadDataset, "dataset " + name, upload.Commit());
}

}  // namespace kiln::server
