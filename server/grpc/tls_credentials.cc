#include "server/grpc/tls_credentials.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kiln::server {
namespace {

std::string FlagFile(const char* flag, const std::string& path) {
  return absl::StrCat("--", flag, "=", path);
}

absl::StatusOr<std::string> ReadPemFile(const char* flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(FlagFile(flag, path), ": cannot read: ", std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Certificate = std::unique_ptr<X509, X509Free>;
using PrivateKey = std::unique_ptr<EVP_PKEY, KeyFree>;

Bio MemoryBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of a PEM text, or null.
Certificate FirstCertificate(const std::string& pem) {
  Bio bio = MemoryBio(pem);
  Certificate cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  return cert;
}

// Never asks for a passphrase on the terminal: an encrypted key simply fails to load.
int NoPassphrase(char*, int, int, void*) { return -1; }

absl::Status CheckCertificate(const char* flag, const std::string& path, X509* cert) {
  if (X509_cmp_current_time(X509_get0_notAfter(cert)) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(FlagFile(flag, path), ": the certificate has expired"));
  }
  return absl::OkStatus();
}

absl::Time NotAfter(X509* cert) {
  std::tm tm{};
  if (ASN1_TIME_to_tm(X509_get0_notAfter(cert), &tm) != 1) return absl::InfinitePast();
  return absl::FromTimeT(timegm(&tm));
}

}  // namespace

TlsMode TlsModeOf(const TlsFiles& files) {
  if (files.cert.empty() && files.key.empty() && files.client_ca.empty()) return TlsMode::kOff;
  return files.client_ca.empty() ? TlsMode::kTls : TlsMode::kMutualTls;
}

const char* TlsModeName(TlsMode mode) {
  switch (mode) {
    case TlsMode::kOff:
      return "off";
    case TlsMode::kTls:
      return "tls";
    case TlsMode::kMutualTls:
      return "mutual";
  }
  return "off";
}

absl::StatusOr<TlsPems> ReadTlsFiles(const TlsFiles& files) {
  if (files.cert.empty() || files.key.empty()) {
    return absl::InvalidArgumentError(
        files.cert.empty() && files.key.empty()
            ? "--tls_client_ca needs --tls_cert and --tls_key: mutual TLS is TLS with client "
              "certificates"
            : "--tls_cert and --tls_key go together: give the certificate and its private key");
  }
  absl::StatusOr<std::string> cert_pem = ReadPemFile("tls_cert", files.cert);
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem = ReadPemFile("tls_key", files.key);
  if (!key_pem.ok()) return key_pem.status();

  Certificate cert = FirstCertificate(*cert_pem);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(FlagFile("tls_cert", files.cert), ": holds no PEM certificate"));
  }
  if (absl::Status s = CheckCertificate("tls_cert", files.cert, cert.get()); !s.ok()) return s;
  Bio key_bio = MemoryBio(*key_pem);
  PrivateKey key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, NoPassphrase, nullptr));
  ERR_clear_error();
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(FlagFile("tls_key", files.key),
                     ": holds no PEM private key (an encrypted key is not "
                     "supported; decrypt it with openssl pkey)"));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(FlagFile("tls_key", files.key),
                                                   ": does not match the certificate in ",
                                                   FlagFile("tls_cert", files.cert)));
  }

  TlsPems pems{*std::move(cert_pem), *std::move(key_pem), "", NotAfter(cert.get())};
  if (!files.client_ca.empty()) {
    absl::StatusOr<std::string> ca_pem = ReadPemFile("tls_client_ca", files.client_ca);
    if (!ca_pem.ok()) return ca_pem.status();
    if (FirstCertificate(*ca_pem) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(FlagFile("tls_client_ca", files.client_ca), ": holds no PEM certificate"));
    }
    pems.client_ca = *std::move(ca_pem);
  }
  return pems;
}

}  // namespace kiln::server
