// grpc.health.v1.Health, kiln's own: Check as gRPC's default service answers it, and Watch
// streams counted against a limit of their own.
//
// Why not gRPC's default health service: it needs no token (right: probes carry none) but puts
// no bound on Watch streams, each holding a call and its buffers until the client goes: 12,000
// of them took kilnd from 25 to 265 MB. Here a Watch beyond --max_health_watches is refused
// (RESOURCE_EXHAUSTED), apart from the --max_streams that authenticated streams share, so
// unauthenticated watchers cannot take those either.
#pragma once

#include <map>
#include <mutex>
#include <set>
#include <string>

#include "grpc/health/v1/health.grpc.pb.h"
#include "server/grpc/stream_slots.h"

namespace kiln::server {

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  explicit HealthService(int max_watches);
  ~HealthService() override;

  // Sets `service`'s status ("": the server as a whole) and tells its watchers.
  void SetServingStatus(const std::string& service, bool serving);
  // Watch streams open now.
  int open_watches() const { return watch_slots_.open(); }

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request) override;

  class WatchReactor;  // health_service.cc

 private:
  using Status = grpc::health::v1::HealthCheckResponse::ServingStatus;
  Status StatusOfLocked(const std::string& service) const;  // SERVICE_UNKNOWN if never set
  friend class WatchReactor;
  void Unregister(WatchReactor* watcher);

  StreamSlots watch_slots_;
  mutable std::mutex mu_;
  std::map<std::string, Status> statuses_;  // guarded
  std::set<WatchReactor*> watchers_;        // guarded
};

}  // namespace kiln::server
