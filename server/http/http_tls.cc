#include "server/http/http_tls.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace kiln::http {

struct TlsHandshakeIdentity::Loaded {
  std::vector<X509*> chain;  // the server's certificate first
  EVP_PKEY* key = nullptr;
  X509_STORE* client_ca = nullptr;  // null: no client certificate asked for

  ~Loaded() {
    for (X509* x : chain) X509_free(x);
    EVP_PKEY_free(key);
    X509_STORE_free(client_ca);
  }
};

namespace {

std::vector<X509*> ReadCertificates(const std::string& pem) {
  std::vector<X509*> certs;
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (bio == nullptr) return certs;
  while (X509* x = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) certs.push_back(x);
  ERR_clear_error();  // the end of the PEM text reads as an error
  BIO_free(bio);
  return certs;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const TlsHandshakeIdentity::Loaded>>
TlsHandshakeIdentity::Current() {
  HttpTlsPems pems = current_();
  std::lock_guard<std::mutex> lock(mu_);
  if (loaded_ != nullptr && pems.cert_chain == loaded_pems_.cert_chain &&
      pems.key == loaded_pems_.key && pems.client_ca == loaded_pems_.client_ca) {
    return loaded_;
  }
  auto loaded = std::make_shared<Loaded>();
  loaded->chain = ReadCertificates(pems.cert_chain);
  if (loaded->chain.empty()) return absl::InvalidArgumentError("TLS: no certificate in the chain");
  BIO* bio = BIO_new_mem_buf(pems.key.data(), static_cast<int>(pems.key.size()));
  if (bio != nullptr) {
    loaded->key = PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
    BIO_free(bio);
  }
  ERR_clear_error();
  if (loaded->key == nullptr) return absl::InvalidArgumentError("TLS: the key does not load");
  if (X509_check_private_key(loaded->chain[0], loaded->key) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError("TLS: the key does not match the certificate");
  }
  if (!pems.client_ca.empty()) {
    loaded->client_ca = X509_STORE_new();
    std::vector<X509*> cas = ReadCertificates(pems.client_ca);
    if (cas.empty()) return absl::InvalidArgumentError("TLS: no certificate in the client CA");
    for (X509* ca : cas) {
      X509_STORE_add_cert(loaded->client_ca, ca);
      X509_free(ca);
    }
  }
  loaded_pems_ = std::move(pems);
  loaded_ = std::move(loaded);
  return loaded_;
}

int TlsHandshakeIdentity::OnCertificate(SSL* ssl, void* self) {
  absl::StatusOr<std::shared_ptr<const Loaded>> loaded =
      static_cast<TlsHandshakeIdentity*>(self)->Current();
  // The reloader only ever serves a set that checked out; failing here ends this handshake.
  if (!loaded.ok()) return 0;
  const Loaded& set = **loaded;
  if (SSL_use_certificate(ssl, set.chain[0]) != 1 || SSL_use_PrivateKey(ssl, set.key) != 1) {
    return 0;
  }
  SSL_clear_chain_certs(ssl);
  for (size_t i = 1; i < set.chain.size(); ++i) {
    if (SSL_add1_chain_cert(ssl, set.chain[i]) != 1) return 0;
  }
  if (set.client_ca != nullptr && SSL_set1_verify_cert_store(ssl, set.client_ca) != 1) return 0;
  return 1;
}

absl::Status TlsHandshakeIdentity::Install(SSL_CTX* ctx) {
  absl::StatusOr<std::shared_ptr<const Loaded>> loaded = Current();
  if (!loaded.ok()) return loaded.status();
  SSL_CTX_set_cert_cb(ctx, &TlsHandshakeIdentity::OnCertificate, this);
  if ((*loaded)->client_ca != nullptr) {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  return absl::OkStatus();
}

}  // namespace kiln::http
