#include "server/grpc/status_mapping.h"

#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/shown_paths.h"

namespace kiln::server {
namespace {

// Messages can echo what a client sent (a name, a path). gRPC carries the message in a header
// with a size limit (8 KiB by default): past it the client would get "metadata size exceeds
// limit" instead of the error. Longer messages keep their start, cut on a UTF-8 boundary.
constexpr size_t kMaxMessageBytes = 1024;

std::string Bounded(std::string_view message) {
  if (message.size() <= kMaxMessageBytes) return std::string(message);
  size_t cut = kMaxMessageBytes - 64;
  while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat(std::string(message.substr(0, cut)), "... (cut short: ", message.size(),
                      " bytes in all)");
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(
      static_cast<grpc::StatusCode>(status.code()),
      Bounded(WithShownPaths(std::string_view(status.message().data(), status.message().size()))));
}

}  // namespace kiln::server
