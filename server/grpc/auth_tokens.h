// The bearer tokens kilnd accepts: read from a file (one token per line, blank lines and lines
// starting with '#' ignored), checked in constant time, and replaced whole on reload.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kiln::server {

// The tokens of a token file's text. InvalidArgument naming the line (never its content, which
// may be a token) for a line with whitespace inside or a byte that is not printable ASCII, and
// when no line holds a token.
absl::StatusOr<std::vector<std::string>> ParseAuthTokens(std::string_view text);

// Thread-safe: Check may run on any number of threads while Reload replaces the set.
class AuthTokens {
 public:
  // Reads `path`; NotFound when it cannot be read, InvalidArgument as ParseAuthTokens. Errors
  // name the file.
  static absl::StatusOr<std::unique_ptr<AuthTokens>> Load(const std::string& path);

  // Reads the file again and swaps the new tokens in; on any error the old ones stay in force.
  // Returns how many tokens are now accepted.
  absl::StatusOr<int> Reload();

  // Whether `token` is one of the accepted tokens. Takes the same time whichever token matches,
  // or none, for tokens of any length: only digests are compared, all of them, without early
  // exit.
  bool Accepts(std::string_view token) const;

  const std::string& path() const { return path_; }
  int size() const;

 private:
  using Digest = std::array<uint8_t, 32>;  // SHA-256
  using DigestSet = std::vector<Digest>;

  explicit AuthTokens(std::string path) : path_(std::move(path)) {}
  static absl::StatusOr<std::shared_ptr<const DigestSet>> ReadDigests(const std::string& path);

  const std::string path_;
  mutable std::mutex mu_;
  std::shared_ptr<const DigestSet> digests_;  // guarded by mu_; the set itself is immutable
};

}  // namespace kiln::server
