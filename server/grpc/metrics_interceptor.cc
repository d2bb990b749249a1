#include "server/grpc/metrics_interceptor.h"

#include <google/protobuf/descriptor.h>
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
    return new GrpcMetricsInterceptor(metrics_, MethodLabel(method != nullptr ? method : ""));
  }

 private:
  // A method a client names is a label only when it is one of the compiled-in services' (the
  // generated descriptor pool knows it): random names would each make a series of their own.
  static std::string MethodLabel(const std::string& method) {
    // "/pkg.Service/Method" -> "pkg.Service.Method"
    if (method.size() < 4 || method[0] != '/') return "unknown";
    std::string full = method.substr(1);
    const size_t slash = full.find('/');
    if (slash == std::string::npos || full.find('/', slash + 1) != std::string::npos) {
      return "unknown";
    }
    full[slash] = '.';
    const bool known =
        google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(full) != nullptr;
    return known ? method : "unknown";
  }

  Metrics* metrics_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewGrpcMetricsInterceptor(
    Metrics* metrics) {
  return std::make_unique<GrpcMetricsInterceptorFactory>(metrics);
}

}  // namespace kiln::server
