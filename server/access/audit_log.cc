#include "server/access/audit_log.h"

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace kiln::server {

void AuditLog::Record(const Caller& caller, Action action, std::string_view object,
                      const absl::Status& outcome) {
  if (log_ == nullptr) return;
  std::vector<LogField> fields = {
      {"user", caller.user},
      {"team", caller.team},
      {"role", RoleName(caller.role)},
      {"action", ActionName(action)},
      {"object", object},
      {"outcome", outcome.ok() ? std::string("ok") : absl::StatusCodeToString(outcome.code())}};
  if (!outcome.ok()) fields.emplace_back("reason", std::string(outcome.message()));
  log_->Log(outcome.ok() ? LogLevel::kInfo : LogLevel::kWarning, "audit", fields);
}

}  // namespace kiln::server
