#include "client/format.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "client/plain_enum_names.h"

namespace kiln::client {

std::string StateName(v1::JobState state) {
  return std::string(absl::StripPrefix(v1::JobState_Name(state), "JOB_STATE_"));
}

std::string CheckpointKindName(v1::CheckpointKind kind) {
  const auto* value = v1::CheckpointKind_descriptor()->FindValueByNumber(kind);
  return value == nullptr ? absl::StrCat(static_cast<int>(kind)) : PlainEnumName(value);
}

std::string FormatClock(absl::Duration d) {
  if (d < absl::ZeroDuration() || d == absl::InfiniteDuration()) return "--:--";
  const int64_t s = absl::ToInt64Seconds(d);
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

std::string DurationText(absl::Duration d) {
  if (d < absl::Seconds(1)) return absl::StrFormat("%dms", absl::ToInt64Milliseconds(d));
  if (d < absl::Minutes(1)) return absl::StrFormat("%.1fs", absl::ToDoubleSeconds(d));
  const int64_t s = absl::ToInt64Seconds(d);
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, (s / 60) % 60);
}

std::string FormatPercent(double fraction) { return absl::StrFormat("%.2f%%", 100.0 * fraction); }

absl::Time ToAbslTime(const google::protobuf::Timestamp& t) {
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

std::string FormatTime(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0 && t.nanos() == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", ToAbslTime(t), absl::UTCTimeZone());
}

std::string FormatAge(const google::protobuf::Timestamp& t, absl::Time now) {
  if (t.seconds() == 0 && t.nanos() == 0) return "-";
  const int64_t s = std::max<int64_t>(0, absl::ToInt64Seconds(now - ToAbslTime(t)));
  if (s < 120) return absl::StrCat(s, "s");
  if (s < 2 * 3600) return absl::StrCat(s / 60, "m");
  if (s < 2 * 86400) return absl::StrCat(s / 3600, "h");
  return absl::StrCat(s / 86400, "d");
}

std::string OwnerText(const v1::Owner& owner) {
  if (owner.user().empty() && owner.team().empty()) return "-";
  return owner.team().empty() ? owner.user() : absl::StrCat(owner.user(), "/", owner.team());
}

std::string ModelSummary(const v1::JobSpec& spec) {
  if (spec.model().layers_size() > 0) {
    std::string s = absl::StrCat("custom (", spec.model().layers_size(), " layers)");
    if (!spec.preset().empty()) absl::StrAppend(&s, " on ", spec.preset());
    return s;
  }
  return spec.preset().empty() ? "-" : spec.preset();
}

}  // namespace kiln::client
