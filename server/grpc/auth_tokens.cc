#include "server/grpc/auth_tokens.h"

#include <openssl/crypto.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/sha256.h"

namespace kiln::server {
namespace {

// Printable ASCII without space: what a gRPC metadata value can carry after "Bearer ".
bool IsTokenByte(unsigned char c) { return c > 0x20 && c < 0x7f; }

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseAuthTokens(std::string_view text) {
  std::vector<std::string> tokens;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);  // also a '\r' from a file saved on Windows
    if (line.empty() || line[0] == '#') continue;
    for (unsigned char c : line) {
      if (!IsTokenByte(c)) {
        // The line may be a token with a typo in it: say where, never what.
        return absl::InvalidArgumentError(
            absl::StrCat("line ", line_number,
                         ": a token must be printable ASCII without spaces (one token per line)"));
      }
    }
    tokens.emplace_back(line);
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        "holds no token (one token per line; blank lines and lines starting with '#' are "
        "ignored)");
  }
  return tokens;
}

absl::StatusOr<std::shared_ptr<const AuthTokens::DigestSet>> AuthTokens::ReadDigests(
    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--auth_tokens_file=", path, ": cannot read"));
  std::ostringstream text;
  text << in.rdbuf();
  absl::StatusOr<std::vector<std::string>> tokens = ParseAuthTokens(text.str());
  if (!tokens.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_tokens_file=", path, ": ", tokens.status().message()));
  }
  auto digests = std::make_shared<DigestSet>();
  for (const std::string& token : *tokens) {
    digests->push_back(Sha256Digest(token));
  }
  return digests;
}

absl::StatusOr<std::unique_ptr<AuthTokens>> AuthTokens::Load(const std::string& path) {
  std::unique_ptr<AuthTokens> tokens(new AuthTokens(path));
  absl::StatusOr<std::shared_ptr<const DigestSet>> digests = ReadDigests(path);
  if (!digests.ok()) return digests.status();
  tokens->digests_ = *std::move(digests);
  return tokens;
}

absl::StatusOr<int> AuthTokens::Reload() {
  absl::StatusOr<std::shared_ptr<const DigestSet>> digests = ReadDigests(path_);
  if (!digests.ok()) return digests.status();
  const int count = static_cast<int>((*digests)->size());
  std::lock_guard<std::mutex> lock(mu_);
  digests_ = *std::move(digests);
  return count;
}

bool AuthTokens::Accepts(std::string_view token) const {
  std::shared_ptr<const DigestSet> digests;
  {
    std::lock_guard<std::mutex> lock(mu_);
    digests = digests_;
  }
  // Hashing first makes the comparison independent of the tokens' lengths.
  const Digest presented = Sha256Digest(absl::string_view(token.data(), token.size()));
  bool accepted = false;
  for (const Digest& d : *digests) {
    accepted |= CRYPTO_memcmp(d.data(), presented.data(), d.size()) == 0;
  }
  return accepted;
}

int AuthTokens::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(digests_->size());
}

}  // namespace kiln::server
