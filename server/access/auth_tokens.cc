#include "server/access/auth_tokens.h"

#include <openssl/crypto.h>

#include <fstream>
#include <map>
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

// A user or team name: what metadata, log lines and label values carry without escaping.
bool IsName(absl::string_view v) {
  if (v.empty() || v.size() > 64) return false;
  for (unsigned char c : v) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '_' && c != '.' && c != '@') return false;
  }
  return true;
}

absl::Status LineError(int line_number, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line_number, ": ", what));
}

// The identity the fields after a line's token give; errors name the field, never the token.
absl::StatusOr<Caller> ParseFields(const std::vector<absl::string_view>& words, int line_number) {
  std::map<std::string, std::string> fields;
  for (size_t i = 1; i < words.size(); ++i) {
    const size_t eq = words[i].find('=');
    const absl::string_view key = words[i].substr(0, eq);
    if (eq == absl::string_view::npos || (key != "user" && key != "team" && key != "role")) {
      return LineError(line_number, absl::StrCat("field ", i, " is not user=, team= or role="));
    }
    if (!fields.emplace(std::string(key), std::string(words[i].substr(eq + 1))).second) {
      return LineError(line_number, absl::StrCat(key, "= given twice"));
    }
  }
  Caller caller;
  const auto role = fields.find("role");
  if (role == fields.end())
    return LineError(line_number, "role= is required (viewer, member or admin)");
  const std::optional<Role> named = RoleNamed(role->second);
  if (!named) {
    return LineError(line_number,
                     absl::StrCat("role=", role->second, ": must be viewer, member or admin"));
  }
  caller.role = *named;
  for (const char* key : {"user", "team"}) {
    const auto it = fields.find(key);
    if (it == fields.end()) {
      if (std::string_view(key) == "team" && caller.role == Role::kAdmin) continue;
      return LineError(line_number, absl::StrCat(key, "= is required"));
    }
    if (!IsName(it->second)) {
      return LineError(
          line_number,
          absl::StrCat(key, "=", it->second, ": 1 to 64 letters, digits, '-', '_', '.' or '@'"));
    }
    (std::string_view(key) == "user" ? caller.user : caller.team) = it->second;
  }
  return caller;
}

}  // namespace

absl::StatusOr<std::vector<TokenIdentity>> ParseAuthTokens(std::string_view text) {
  std::vector<TokenIdentity> tokens;
  std::map<std::string, int> line_of_token;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);  // also a '\r' from a file saved on Windows
    if (line.empty() || line[0] == '#') continue;
    const std::vector<absl::string_view> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    for (unsigned char c : words[0]) {
      if (!IsTokenByte(c)) {
        // The line may be a token with a typo in it: say where, never what.
        return LineError(line_number,
                         "a token must be printable ASCII without spaces (one token per line, "
                         "then user=, team= and role=)");
      }
    }
    TokenIdentity entry;
    entry.token = std::string(words[0]);
    if (words.size() == 1) {
      entry.caller = Caller{"admin", "", Role::kAdmin};
      entry.bare = true;
    } else {
      absl::StatusOr<Caller> caller = ParseFields(words, line_number);
      if (!caller.ok()) return caller.status();
      entry.caller = *std::move(caller);
    }
    if (const auto [it, added] = line_of_token.emplace(entry.token, line_number); !added) {
      return LineError(line_number, absl::StrCat("repeats the token of line ", it->second,
                                                 " (one identity per token)"));
    }
    tokens.push_back(std::move(entry));
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        "holds no token (one token per line; blank lines and lines starting with '#' are "
        "ignored)");
  }
  return tokens;
}

absl::StatusOr<std::shared_ptr<const AuthTokens::EntrySet>> AuthTokens::ReadEntries(
    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--auth_tokens_file=", path, ": cannot read"));
  std::ostringstream text;
  text << in.rdbuf();
  absl::StatusOr<std::vector<TokenIdentity>> tokens = ParseAuthTokens(text.str());
  if (!tokens.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_tokens_file=", path, ": ", tokens.status().message()));
  }
  auto entries = std::make_shared<EntrySet>();
  for (TokenIdentity& t : *tokens) {
    entries->push_back(Entry{Sha256Digest(t.token), std::move(t.caller), t.bare});
  }
  return entries;
}

absl::StatusOr<std::unique_ptr<AuthTokens>> AuthTokens::Load(const std::string& path) {
  std::unique_ptr<AuthTokens> tokens(new AuthTokens(path));
  absl::StatusOr<std::shared_ptr<const EntrySet>> entries = ReadEntries(path);
  if (!entries.ok()) return entries.status();
  tokens->entries_ = *std::move(entries);
  return tokens;
}

absl::StatusOr<int> AuthTokens::Reload() {
  absl::StatusOr<std::shared_ptr<const EntrySet>> entries = ReadEntries(path_);
  if (!entries.ok()) return entries.status();
  const int count = static_cast<int>((*entries)->size());
  std::lock_guard<std::mutex> lock(mu_);
  entries_ = *std::move(entries);
  return count;
}

std::optional<Caller> AuthTokens::Find(std::string_view token) const {
  std::shared_ptr<const EntrySet> entries;
  {
    std::lock_guard<std::mutex> lock(mu_);
    entries = entries_;
  }
  // Hashing first makes the comparison independent of the tokens' lengths; every entry is
  // compared, and the match is picked without a branch on it.
  const Digest presented = Sha256Digest(absl::string_view(token.data(), token.size()));
  size_t match = entries->size();
  for (size_t i = 0; i < entries->size(); ++i) {
    const size_t equal = static_cast<size_t>(
        CRYPTO_memcmp((*entries)[i].digest.data(), presented.data(), presented.size()) == 0);
    match = equal * i + (1 - equal) * match;
  }
  if (match == entries->size()) return std::nullopt;
  return (*entries)[match].caller;
}

int AuthTokens::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(entries_->size());
}

int AuthTokens::bare_tokens() const {
  std::lock_guard<std::mutex> lock(mu_);
  int bare = 0;
  for (const Entry& e : *entries_) bare += e.bare ? 1 : 0;
  return bare;
}

}  // namespace kiln::server
