// The bearer tokens kilnd accepts and who each one is: read from a file, checked in constant
// time, and replaced whole on reload.
//
// One token a line, optionally followed by its identity's fields (blank lines and lines starting
// with '#' ignored):
//   TOKEN user=alice team=vision role=member
// role is viewer, member or admin (access_rules.h); user and role are required once a line has
// fields, team too unless the role is admin. A line holding only a token (the file before
// identities) is an admin named "admin" of no team.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/access/caller.h"

namespace kiln::server {

// One line of a token file.
struct TokenIdentity {
  std::string token;
  Caller caller;
  bool bare = false;  // the line held only the token (an admin, as before identities)
};

// The tokens of a token file's text. InvalidArgument naming the line (never its token) for a
// token with a byte that is not printable ASCII, a field that is not key=value with a known key,
// a missing or bad user, team or role, a token given twice, and when no line holds a token.
absl::StatusOr<std::vector<TokenIdentity>> ParseAuthTokens(std::string_view text);

// Thread-safe: Find may run on any number of threads while Reload replaces the set.
class AuthTokens {
 public:
  // Reads `path`; NotFound when it cannot be read, InvalidArgument as ParseAuthTokens. Errors
  // name the file.
  static absl::StatusOr<std::unique_ptr<AuthTokens>> Load(const std::string& path);

  // Reads the file again and swaps the new tokens in; on any error the old ones stay in force.
  // Returns how many tokens are now accepted.
  absl::StatusOr<int> Reload();

  // Who `token` is, or nullopt when it is not accepted. Takes the same time whichever token
  // matches, or none, for tokens of any length: only digests are compared, all of them, without
  // early exit.
  std::optional<Caller> Find(std::string_view token) const;
  bool Accepts(std::string_view token) const { return Find(token).has_value(); }

  const std::string& path() const { return path_; }
  int size() const;
  // Lines holding only a token (each an admin): kilnd says so in its log at start and reload.
  int bare_tokens() const;

 private:
  using Digest = std::array<uint8_t, 32>;  // SHA-256
  struct Entry {
    Digest digest;
    Caller caller;
    bool bare;
  };
  using EntrySet = std::vector<Entry>;

  explicit AuthTokens(std::string path) : path_(std::move(path)) {}
  static absl::StatusOr<std::shared_ptr<const EntrySet>> ReadEntries(const std::string& path);

  const std::string path_;
  mutable std::mutex mu_;
  std::shared_ptr<const EntrySet> entries_;  // guarded by mu_; the set itself is immutable
};

}  // namespace kiln::server
