#include "common/sha256.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kiln {

struct Sha256::State {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  ~State() { EVP_MD_CTX_free(ctx); }
};

Sha256::Sha256() : state_(std::make_unique<State>()) {
  EVP_DigestInit_ex(state_->ctx, EVP_sha256(), nullptr);
}

Sha256::~Sha256() = default;

void Sha256::Update(absl::string_view data) {
  EVP_DigestUpdate(state_->ctx, data.data(), data.size());
}

std::array<uint8_t, 32> Sha256::Digest() {
  std::array<uint8_t, 32> digest{};
  unsigned int length = 0;
  EVP_DigestFinal_ex(state_->ctx, digest.data(), &length);
  return digest;
}

std::string Sha256::HexDigest() {
  const std::array<uint8_t, 32> digest = Digest();
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest.data()), digest.size()));
}

std::array<uint8_t, 32> Sha256Digest(absl::string_view data) {
  Sha256 sha;
  sha.Update(data);
  return sha.Digest();
}

std::string Sha256Hex(absl::string_view data) {
  Sha256 sha;
  sha.Update(data);
  return sha.HexDigest();
}

absl::StatusOr<std::string> Sha256OfFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  Sha256 sha;
  std::vector<char> buffer(1 << 20);
  ssize_t n;
  while ((n = ::read(fd, buffer.data(), buffer.size())) != 0) {
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return absl::DataLossError(absl::StrCat(path, ": read failed: ", std::strerror(err)));
    }
    sha.Update(absl::string_view(buffer.data(), static_cast<size_t>(n)));
  }
  ::close(fd);
  return sha.HexDigest();
}

}  // namespace kiln
