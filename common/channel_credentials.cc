#include "common/channel_credentials.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kiln {
namespace {

absl::StatusOr<std::string> ReadPem(const char* flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": cannot read ", path));
  std::ostringstream pem;
  pem << in.rdbuf();
  return pem.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientTlsFiles& files) {
  if (!files.tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;  // no CA given: gRPC's default roots
  if (!files.ca.empty()) {
    KILN_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPem(files.ca_flag, files.ca));
  }
  if (!files.cert.empty()) {
    KILN_ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadPem(files.cert_flag, files.cert));
    KILN_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadPem(files.key_flag, files.key));
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace kiln
