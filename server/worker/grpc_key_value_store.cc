#include "server/worker/grpc_key_value_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace kiln::worker {
namespace {

// The most kilnd waits in one GetKey (worker.proto).
constexpr absl::Duration kMaxServerWait = absl::Minutes(10);
// What a call may take beyond the wait it asks kilnd for: the round trip.
constexpr absl::Duration kCallMargin = absl::Seconds(10);

}  // namespace

absl::Status GrpcKeyValueStore::Set(const std::string& key, const std::string& value) {
  v1::SetKeyRequest request;
  request.set_job_id(job_id_);
  request.set_key(key);
  request.set_value(value);
  v1::SetKeyResponse response;
  auto context = connection_->NewContext(kCallMargin);
  return FromGrpc(connection_->stub().SetKey(context.get(), request, &response),
                  absl::StrCat("setting rendezvous key \"", key, "\""));
}

absl::StatusOr<std::string> GrpcKeyValueStore::Get(const std::string& key, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const absl::Duration wait =
        std::clamp(deadline - absl::Now(), absl::ZeroDuration(), kMaxServerWait);
    v1::GetKeyRequest request;
    request.set_job_id(job_id_);
    request.set_key(key);
    request.set_timeout_ms(absl::ToInt64Milliseconds(wait));
    v1::GetKeyResponse response;
    auto context = connection_->NewContext(wait + kCallMargin);
    grpc::Status status = connection_->stub().GetKey(context.get(), request, &response);
    if (status.ok()) return std::string(response.value());
    if (status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED || absl::Now() >= deadline) {
      if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        return absl::DeadlineExceededError(
            absl::StrCat("rendezvous key \"", key, "\" was not set within ",
                         absl::FormatDuration(timeout), " (a peer did not join)"));
      }
      return FromGrpc(status, absl::StrCat("getting rendezvous key \"", key, "\""));
    }
    // kilnd's longest wait passed with time left: ask again.
  }
}

absl::Status GrpcKeyValueStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (size_t i = 0; i < keys.size(); ++i) {
    absl::StatusOr<std::string> value =
        Get(keys[i], std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (value.ok()) continue;
    if (value.status().code() != absl::StatusCode::kDeadlineExceeded) return value.status();
    std::vector<std::string> missing(keys.begin() + static_cast<ptrdiff_t>(i), keys.end());
    return absl::DeadlineExceededError(absl::StrCat("rendezvous keys not set within ",
                                                    absl::FormatDuration(timeout), ": ",
                                                    absl::StrJoin(missing, ", ")));
  }
  return absl::OkStatus();
}

}  // namespace kiln::worker
