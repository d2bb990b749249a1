#include "server/access/caller.h"

namespace kiln::server {

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kViewer:
      return "viewer";
    case Role::kMember:
      return "member";
    case Role::kAdmin:
      return "admin";
  }
  return "unknown";
}

std::optional<Role> RoleNamed(std::string_view name) {
  for (Role role : {Role::kViewer, Role::kMember, Role::kAdmin}) {
    if (name == RoleName(role)) return role;
  }
  return std::nullopt;
}

}  // namespace kiln::server
