// The audit log: one event line ("audit", in kilnd's log format: text or JSON) for every call
// that changes something or was refused one: who (user, team, role), what (the action), which
// object, and the outcome (ok, or the status code and its message).
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "server/access/access_rules.h"
#include "server/observability/logging.h"

namespace kiln::server {

// Thread-safe (EventLog is).
class AuditLog {
 public:
  // `log` null: nothing is written (tests of the rules alone).
  explicit AuditLog(EventLog* log) : log_(log) {}

  void Record(const Caller& caller, Action action, std::string_view object,
              const absl::Status& outcome);

 private:
  EventLog* const log_;
};

}  // namespace kiln::server
