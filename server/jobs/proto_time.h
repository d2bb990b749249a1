// Conversions between google.protobuf.Timestamp and Unix milliseconds, the store's time unit.
#pragma once

#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/timestamp.pb.h"

namespace kiln::server {

inline int64_t TimestampToMillis(const google::protobuf::Timestamp& t) {
  return t.seconds() * 1000 + t.nanos() / 1000000;
}

inline google::protobuf::Timestamp MillisToTimestamp(int64_t ms) {
  google::protobuf::Timestamp t;
  t.set_seconds(ms / 1000);
  t.set_nanos(static_cast<int32_t>(ms % 1000) * 1000000);
  return t;
}

inline int64_t NowMillis() { return absl::ToUnixMillis(absl::Now()); }

}  // namespace kiln::server
