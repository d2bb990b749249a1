#include "server/grpc/metrics_interceptor.h"

#include <grpcpp/support/server_interceptor.h>

#include <chrono>
#include <string>
#include <utility>

namespace kiln::server {
namespace {

// Records each call's method, final code and duration.
class GrpcMetricsInterceptor : public grpc::experimental::Interceptor {
 public:
  GrpcMetricsInterceptor(Metrics* metrics, std::string method)
      : metrics_(metrics), method_(std::move(method)), start_(std::chrono::steady_clock::now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      metrics_->RecordGrpc(method_, status.error_code(), seconds);
    }
    methods->Proceed();
  }

 private:
  Metrics* metrics_;
  const std::string method_;
  const std::chrono::steady_clock::time_point start_;
};

class GrpcMetricsInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit GrpcMetricsInterceptorFactory(Metrics* metrics) : metrics_(metrics) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    const char* method = info->method();
    return new GrpcMetricsInterceptor(metrics_, method != nullptr ? method : "unknown");
  }

 private:
  Metrics* metrics_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewGrpcMetricsInterceptor(
    Metrics* metrics) {
  return std::make_unique<GrpcMetricsInterceptorFactory>(metrics);
}

}  // namespace kiln::server
