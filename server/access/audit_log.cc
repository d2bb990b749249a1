#include "server/access/audit_log.h"

#include <string>

#include "absl/status/status.h"

namespace kiln::server {

void AuditLog::Record(const Caller& caller, Action action, std::string_view object,
                      const absl::Status& outcome) {
  if (log_ == nullptr) return;
  const std::string code = outcome.ok() ? "ok" : absl::StatusCodeToString(outcome.code());
  if (outcome.ok()) {
    log_->Log(LogLevel::kInfo, "audit",
              {{"user", caller.user},
               {"team", caller.team},
               {"role", RoleName(caller.role)},
               {"action", ActionName(action)},
               {"object", object},
               {"outcome", code}});
  } else {
    log_->Log(LogLevel::kWarning, "audit",
              {{"user", caller.user},
               {"team", caller.team},
               {"role", RoleName(caller.role)},
               {"action", ActionName(action)},
               {"object", object},
               {"outcome", code},
               {"reason", std::string(outcome.message())}});
  }
}

}  // namespace kiln::server
