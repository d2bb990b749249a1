// Who is asking: the identity a bearer token names in the token file (auth_tokens.h). Every
// front end (gRPC, REST, the web page) learns the caller of a request and hands it to the access
// rules (access_rules.h) and to what the request changes, which records it as the owner.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kiln::server {

// What a caller may do (access_rules.h): viewers read and predict, members also change their
// team's jobs, datasets and deployments, admins do everything for every team.
enum class Role { kViewer, kMember, kAdmin };

// "viewer", "member", "admin".
std::string_view RoleName(Role role);
// The role of that name; nullopt for any other word.
std::optional<Role> RoleNamed(std::string_view name);

struct Caller {
  std::string user;
  std::string team;  // may be empty for an admin
  Role role = Role::kViewer;

  // Every caller while kilnd checks no tokens (no --auth_tokens_file): an admin of no team, as
  // kilnd treated every caller before it knew identities.
  static Caller Unchecked() { return Caller{"", "", Role::kAdmin}; }
};

}  // namespace kiln::server
