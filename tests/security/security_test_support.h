// Pieces of the security tests: certificates made with the openssl CLI at test time, a kilnd
// child whose stdout and stderr are captured (for its ports, its log, and signals), a scrape of
// its /metrics, and calls that only a generic client makes (reflection).
#pragma once

#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cli_test_support.h"
#include "grpcpp/grpcpp.h"
#include "tests/support/kilnd_child.h"

namespace kiln::security::testing {

// PEM files under one folder. The CA signs everything but the stranger's certificate, which an
// unrelated CA signs. All keys are unencrypted P-256.
struct TestPki {
  std::string ca_cert;
  std::string server_cert, server_key;              // SAN IP:127.0.0.1, DNS:localhost
  std::string named_server_cert, named_server_key;  // SAN DNS:kilnd.test only
  std::string client_cert, client_key;              // extendedKeyUsage clientAuth
  std::string other_ca_cert;
  std::string stranger_cert, stranger_key;  // a client certificate of the other CA
};

// Makes a TestPki in `dir` (which must exist) with /usr/bin/openssl; the error names the step
// that failed and what openssl said.
absl::StatusOr<TestPki> MakeTestPki(const std::string& dir);

// Writes a self-signed certificate that expired a day ago and its key (PEM), with OpenSSL's C
// API (the CLI of OpenSSL 3.0 cannot date a certificate in the past).
absl::Status WriteExpiredCertificate(const std::string& cert_path, const std::string& key_path);

// kilnd as a child (tests/support/kilnd_child.h) with /metrics on a port of its own, and fresh
// state and data folders under `root`.
class KilndUnderTest : public kiln::testing::KilndChild {
 public:
  explicit KilndUnderTest(std::string root) : root_(std::move(root)) {}
  bool Start(const std::vector<std::string>& extra_args) {
    return KilndChild::Start(root_ + "/state", root_ + "/data", extra_args, /*metrics=*/true);
  }
  // SIGTERM, then the exit code (-1 when it did not exit within 30 s).
  int Stop() { return KilndChild::Stop(SIGTERM, absl::Seconds(30)); }

 private:
  std::string root_;
};

// The text of http://127.0.0.1:`port`/metrics, or an error saying why not.
absl::StatusOr<std::string> ScrapeMetrics(int port);
// The value of one sample line ("name{labels} value") in a scrape; -1 when absent.
double SampleValue(const std::string& scrape, const std::string& series);

// A TLS channel to kilnd, READY when returned, verifying with `ca_file` (optionally presenting a
// client certificate). Plaintext: kiln::testing::ConnectedChannel.
std::shared_ptr<grpc::Channel> TlsChannel(const std::string& address, const std::string& ca_file,
                                          const std::string& cert_file = "",
                                          const std::string& key_file = "");

// A client context with "authorization: Bearer `token`" (none when empty) and a 10 s deadline.
std::unique_ptr<grpc::ClientContext> ContextWithToken(const std::string& token);

// Lists the services through gRPC reflection (v1alpha) with a generic bidi call; on success
// `services` holds the raw response bytes (the names appear in them).
grpc::Status ListServicesByReflection(const std::shared_ptr<grpc::Channel>& channel,
                                      const std::string& token, std::string* services);

}  // namespace kiln::security::testing
