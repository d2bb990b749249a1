// The access rules, in one place for every front end: what each role may do (Authorize), and
// which objects a caller sees (Sees). An object another team owns is answered as if it did not
// exist (NOT_FOUND, never a hint), so Sees is asked where the object is looked up.
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "server/access/caller.h"

namespace kiln::server {

// The things a caller asks for, by the least role that may.
enum class Action {
  // Viewers and up.
  kRead,     // jobs, their events and metrics, checkpoints' metadata, datasets, models
  kPredict,  // inference and generation
  // Members and up, on their own team's objects.
  kSubmitJob,
  kCancelJob,
  kResumeJob,
  kCreateCheckpoint,
  kDeleteCheckpoint,
  kExportCheckpoint,  // the weights themselves, more than metadata
  kGetWorkerToken,    // a credential of the job
  kUploadDataset,
  kDeleteDataset,
  kDeploy,
  kUndeploy,
};

// "submit_job", "cancel_job", ...: the audit log's `action`.
std::string_view ActionName(Action action);

// Whether the caller's role may ask for `action` at all (its team is Sees's): OK, or
// PermissionDenied naming the user, the role, what was refused and what the role may do.
absl::Status Authorize(const Caller& caller, Action action);

// Whether `caller` sees an object owned by `owner_team` (its id, its metadata): admins see
// everything, others their own team's objects and those of no team (made before kilnd knew
// identities, while auth was off, or datasets placed in the data dir by hand), which every team
// shares.
bool Sees(const Caller& caller, std::string_view owner_team);

// Authorize, then whether `caller` may change an object it sees, owned by `owner_team`: its own
// team's; one of no team only an admin. PermissionDenied otherwise.
absl::Status AuthorizeOn(const Caller& caller, Action action, std::string_view owner_team);

}  // namespace kiln::server
