#include "security_test_support.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "grpcpp/generic/generic_stub.h"
#include "tests/support/connected_channel.h"

namespace kiln::security::testing {
namespace {

using client::testing::RunCommand;
using client::testing::RunResult;

constexpr char kOpenssl[] = "/usr/bin/openssl";

absl::Status Openssl(const std::string& step, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {kOpenssl};
  argv.insert(argv.end(), args.begin(), args.end());
  RunResult r = RunCommand(argv, {}, absl::Seconds(30));
  if (r.exit_code != 0) {
    return absl::InternalError(
        absl::StrCat("openssl (", step, ") exited ", r.exit_code, ": ", r.err));
  }
  return absl::OkStatus();
}

// A P-256 key and a certificate for it signed by `ca`/`ca_key` (self-signed when `ca` is empty),
// with the extensions in `extensions` (an openssl extfile line).
absl::Status MakeCertificate(const std::string& dir, const std::string& name,
                             const std::string& subject, const std::string& ca,
                             const std::string& ca_key, const std::string& extensions) {
  const std::string key = absl::StrCat(dir, "/", name, ".key.pem");
  const std::string cert = absl::StrCat(dir, "/", name, ".pem");
  if (ca.empty()) {
    return Openssl(name, {"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                          "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", subject});
  }
  const std::string csr = absl::StrCat(dir, "/", name, ".csr");
  const std::string ext = absl::StrCat(dir, "/", name, ".ext");
  client::testing::WriteFile(ext, extensions + "\n");
  if (absl::Status s =
          Openssl(name + " request", {"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                                      "-nodes", "-keyout", key, "-out", csr, "-subj", subject});
      !s.ok()) {
    return s;
  }
  return Openssl(name + " signing",
                 {"x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
                  "-out", cert, "-days", "2", "-extfile", ext});
}

}  // namespace

absl::StatusOr<TestPki> MakeTestPki(const std::string& dir) {
  TestPki pki;
  auto path = [&dir](const std::string& file) { return absl::StrCat(dir, "/", file); };
  pki.ca_cert = path("ca.pem");
  const std::string ca_key = path("ca.key.pem");
  pki.other_ca_cert = path("other-ca.pem");
  const std::string other_ca_key = path("other-ca.key.pem");
  const struct {
    std::string name, subject, ca, ca_key, extensions;
  } steps[] = {
      {"ca", "/CN=kiln test CA", "", "", ""},
      {"other-ca", "/CN=unrelated test CA", "", "", ""},
      {"server", "/CN=kilnd", pki.ca_cert, ca_key,
       "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth"},
      {"named-server", "/CN=kilnd.test", pki.ca_cert, ca_key,
       "subjectAltName=DNS:kilnd.test\nextendedKeyUsage=serverAuth"},
      {"client", "/CN=kiln client", pki.ca_cert, ca_key, "extendedKeyUsage=clientAuth"},
      {"stranger", "/CN=stranger", pki.other_ca_cert, other_ca_key, "extendedKeyUsage=clientAuth"},
  };
  for (const auto& step : steps) {
    if (absl::Status s =
            MakeCertificate(dir, step.name, step.subject, step.ca, step.ca_key, step.extensions);
        !s.ok()) {
      return s;
    }
  }
  pki.server_cert = path("server.pem");
  pki.server_key = path("server.key.pem");
  pki.named_server_cert = path("named-server.pem");
  pki.named_server_key = path("named-server.key.pem");
  pki.client_cert = path("client.pem");
  pki.client_key = path("client.key.pem");
  pki.stranger_cert = path("stranger.pem");
  pki.stranger_key = path("stranger.key.pem");
  return pki;
}

absl::Status WriteExpiredCertificate(const std::string& cert_path, const std::string& key_path) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* cert = X509_new();
  absl::Status status = absl::OkStatus();
  if (key == nullptr || cert == nullptr) status = absl::InternalError("OpenSSL allocation failed");
  if (status.ok()) {
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
    X509_gmtime_adj(X509_getm_notBefore(cert), -2 * 86400);
    X509_gmtime_adj(X509_getm_notAfter(cert), -86400);
    X509_set_pubkey(cert, key);
    X509_NAME* name = X509_get_subject_name(cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>("expired"), -1, -1, 0);
    X509_set_issuer_name(cert, name);
    if (X509_sign(cert, key, EVP_sha256()) == 0) status = absl::InternalError("X509_sign failed");
  }
  if (status.ok()) {
    BIO* cert_out = BIO_new_file(cert_path.c_str(), "w");
    BIO* key_out = BIO_new_file(key_path.c_str(), "w");
    if (cert_out == nullptr || key_out == nullptr || PEM_write_bio_X509(cert_out, cert) != 1 ||
        PEM_write_bio_PrivateKey(key_out, key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
      status = absl::InternalError("writing the expired certificate failed");
    }
    BIO_free(cert_out);
    BIO_free(key_out);
  }
  X509_free(cert);
  EVP_PKEY_free(key);
  return status;
}

absl::StatusOr<std::string> ScrapeMetrics(int port) {
  // With --tls_cert the port speaks TLS; these tests read metrics there without checking the
  // certificate (the TLS tests check it).
  httplib::ClientImpl plain("127.0.0.1", port);
  httplib::SSLClient tls("127.0.0.1", port);
  tls.enable_server_certificate_verification(false);
  for (httplib::ClientImpl* client : {&plain, static_cast<httplib::ClientImpl*>(&tls)}) {
    client->set_read_timeout(10, 0);
    httplib::Result r = client->Get("/metrics");
    if (!r) continue;
    if (r->status != 200) {
      return absl::UnknownError(
          absl::StrCat("/metrics answered ", r->status, ": ", r->body.substr(0, 200)));
    }
    return r->body;
  }
  return absl::UnavailableError(absl::StrCat("cannot read /metrics on port ", port));
}

double SampleValue(const std::string& scrape, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(scrape, '\n')) {
    if (!absl::StartsWith(line, series + " ")) continue;
    double value = -1;
    if (absl::SimpleAtod(line.substr(series.size() + 1), &value)) return value;
  }
  return -1;
}

std::shared_ptr<grpc::Channel> TlsChannel(const std::string& address, const std::string& ca_file,
                                          const std::string& cert_file,
                                          const std::string& key_file) {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = client::testing::ReadFile(ca_file);
  if (!cert_file.empty()) {
    ssl.pem_cert_chain = client::testing::ReadFile(cert_file);
    ssl.pem_private_key = client::testing::ReadFile(key_file);
  }
  return kiln::testing::ConnectedChannel(address, grpc::SslCredentials(ssl));
}

std::unique_ptr<grpc::ClientContext> ContextWithToken(const std::string& token) {
  auto context = std::make_unique<grpc::ClientContext>();
  if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return context;
}

grpc::Status ListServicesByReflection(const std::shared_ptr<grpc::Channel>& channel,
                                      const std::string& token, std::string* services) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::ClientContext> context = ContextWithToken(token);
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = stub.PrepareCall(
      context.get(), "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag = nullptr;
  bool ok = false;
  auto step = [&](int id) {
    return cq.Next(&tag, &ok) && tag == reinterpret_cast<void*>(id) && ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  if (step(1)) {
    // ServerReflectionRequest{list_services: "*"}: field 7, length-delimited.
    const std::string bytes("\x3a\x01*", 3);
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1);
    call->Write(request, reinterpret_cast<void*>(2));
    if (step(2)) {
      call->WritesDone(reinterpret_cast<void*>(3));
      step(3);
      for (;;) {
        grpc::ByteBuffer response;
        call->Read(&response, reinterpret_cast<void*>(4));
        if (!step(4)) break;
        std::vector<grpc::Slice> slices;
        if (!response.Dump(&slices).ok()) break;
        for (const grpc::Slice& s : slices) {
          services->append(reinterpret_cast<const char*>(s.begin()), s.size());
        }
      }
    }
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

}  // namespace kiln::security::testing
