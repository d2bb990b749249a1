#include "server/grpc/health_service.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/grpc/write_reactors.h"

namespace kiln::server {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// One Watch: the service's status now, then each change, latest first: a watcher that reads
// slowly sees the newest status, not a backlog.
class HealthService::WatchReactor final : public StreamWriterReactor<HealthCheckResponse> {
 public:
  WatchReactor(HealthService* owner, std::string service, StreamSlots::Slot slot)
      : owner_(owner), service_(std::move(service)), slot_(std::move(slot)) {}

  const std::string& service() const { return service_; }
  // With the owner's lock held: the status to send (now or after the write in flight).
  void Update(Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ = status;
    WriteLocked();
  }

  void OnDone() override {
    owner_->Unregister(this);  // after this no Update can reach it
    delete this;
  }

 private:
  void WriteNextLocked() override {
    if (!pending_.has_value()) return;
    if (sent_.has_value() && *sent_ == *pending_) {
      pending_.reset();
      return;
    }
    response_.set_status(*pending_);
    sent_ = *pending_;
    pending_.reset();
    StartWriteLocked(&response_);
  }

  HealthService* const owner_;
  const std::string service_;
  StreamSlots::Slot slot_;  // given back when the reactor goes
  std::optional<Status> pending_, sent_;
  HealthCheckResponse response_;
};

HealthService::HealthService(int max_watches) : watch_slots_(max_watches, "--max_health_watches") {}

HealthService::~HealthService() = default;

HealthService::Status HealthService::StatusOfLocked(const std::string& service) const {
  auto it = statuses_.find(service);
  return it == statuses_.end() ? HealthCheckResponse::SERVICE_UNKNOWN : it->second;
}

void HealthService::SetServingStatus(const std::string& service, bool serving) {
  std::lock_guard<std::mutex> lock(mu_);
  const Status status = serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
  statuses_[service] = status;
  for (WatchReactor* watcher : watchers_) {
    if (watcher->service() == service) watcher->Update(status);
  }
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* context,
                                               const HealthCheckRequest* request,
                                               HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::lock_guard<std::mutex> lock(mu_);
  const Status status = StatusOfLocked(request->service());
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND,
                                 absl::StrCat("unknown service \"", request->service(), "\"")));
    return reactor;
  }
  response->set_status(status);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext* /*context*/, const HealthCheckRequest* request) {
  absl::StatusOr<StreamSlots::Slot> slot = watch_slots_.Acquire();
  // Refused with the limit named.
  if (!slot.ok()) return new RefusedWrite<HealthCheckResponse>(slot.status());
  auto* reactor = new WatchReactor(this, request->service(), *std::move(slot));
  std::lock_guard<std::mutex> lock(mu_);
  watchers_.insert(reactor);
  reactor->Update(StatusOfLocked(request->service()));
  return reactor;
}

void HealthService::Unregister(WatchReactor* watcher) {
  std::lock_guard<std::mutex> lock(mu_);
  watchers_.erase(watcher);
}

}  // namespace kiln::server
