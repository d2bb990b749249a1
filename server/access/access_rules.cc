#include "server/access/access_rules.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace kiln::server {
namespace {

Role LeastRoleFor(Action action) {
  switch (action) {
    case Action::kRead:
    case Action::kPredict:
      return Role::kViewer;
    default:
      return Role::kMember;
  }
}

// What a role may do, for the refusal's message.
std::string_view RoleMay(Role role) {
  switch (role) {
    case Role::kViewer:
      return "a viewer reads jobs, metrics, checkpoints' metadata, datasets and models, and "
             "predicts";
    case Role::kMember:
      return "a member also changes their team's jobs, datasets and deployments";
    case Role::kAdmin:
      return "an admin does everything";
  }
  return "";
}

}  // namespace

std::string_view ActionName(Action action) {
  switch (action) {
    case Action::kRead:
      return "read";
    case Action::kPredict:
      return "predict";
    case Action::kSubmitJob:
      return "submit_job";
    case Action::kCancelJob:
      return "cancel_job";
    case Action::kResumeJob:
      return "resume_job";
    case Action::kCreateCheckpoint:
      return "create_checkpoint";
    case Action::kDeleteCheckpoint:
      return "delete_checkpoint";
    case Action::kExportCheckpoint:
      return "export_checkpoint";
    case Action::kGetWorkerToken:
      return "get_worker_token";
    case Action::kUploadDataset:
      return "upload_dataset";
    case Action::kDeleteDataset:
      return "delete_dataset";
    case Action::kDeploy:
      return "deploy";
    case Action::kUndeploy:
      return "undeploy";
  }
  return "unknown";
}

absl::Status Authorize(const Caller& caller, Action action) {
  if (static_cast<int>(caller.role) >= static_cast<int>(LeastRoleFor(action))) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "user \"", caller.user, "\" (role ", std::string(RoleName(caller.role)), ") may not ",
      std::string(ActionName(action)), ": ", std::string(RoleMay(caller.role))));
}

bool Sees(const Caller& caller, std::string_view owner_team) {
  return caller.role == Role::kAdmin || owner_team.empty() || owner_team == caller.team;
}

absl::Status AuthorizeOn(const Caller& caller, Action action, std::string_view owner_team) {
  if (absl::Status s = Authorize(caller, action); !s.ok()) return s;
  if (caller.role == Role::kAdmin || (!owner_team.empty() && owner_team == caller.team)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat("user \"", caller.user, "\" may not ", std::string(ActionName(action)), ": ",
                   owner_team.empty() ? "it belongs to no team (admins only change those)"
                                      : "it belongs to another team"));
}

}  // namespace kiln::server
