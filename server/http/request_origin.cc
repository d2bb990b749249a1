#include "server/http/request_origin.h"

#include <arpa/inet.h>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kiln::http {
namespace {

// "host:port" or "[v6]:port" -> host (brackets kept off), lower-case.
std::string HostOf(std::string_view authority) {
  std::string host(authority);
  if (!host.empty() && host.front() == '[') {
    const size_t close = host.find(']');
    host = close == std::string::npos ? host.substr(1) : host.substr(1, close - 1);
  } else if (const size_t colon = host.rfind(':'); colon != std::string::npos) {
    host = host.substr(0, colon);
  }
  return absl::AsciiStrToLower(host);
}

bool IsIpLiteral(const std::string& host) {
  unsigned char buf[16];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

// The part of an Origin ("scheme://host[:port]") after the scheme, lower-case.
std::string AuthorityOf(std::string_view origin) {
  const size_t scheme = origin.find("://");
  return absl::AsciiStrToLower(
      std::string(scheme == std::string_view::npos ? origin : origin.substr(scheme + 3)));
}

// A Host header without a port means the scheme's default; an Origin names it only when it is
// not the default. Compare both with the port written out.
std::string WithPort(const std::string& authority, std::string_view scheme_default) {
  const bool bracketed = !authority.empty() && authority.front() == '[';
  const size_t colon = authority.rfind(':');
  const bool has_port =
      bracketed ? authority.find("]:") != std::string::npos : colon != std::string::npos;
  return has_port ? authority : absl::StrCat(authority, ":", std::string(scheme_default));
}

}  // namespace

absl::Status CheckRequestOrigin(std::string_view host_header, std::string_view origin,
                                std::string_view sec_fetch_site, const OriginPolicy& policy,
                                bool check_host_name) {
  // Shown back bounded: these are a client's bytes.
  auto shown = [](std::string_view v) { return std::string(v.substr(0, 100)); };
  const std::string host = HostOf(host_header);
  const bool allowed = host.empty() || host == "localhost" || IsIpLiteral(host) ||
                       std::find(policy.allowed_hosts.begin(), policy.allowed_hosts.end(), host) !=
                           policy.allowed_hosts.end();
  if (check_host_name && !allowed) {
    return absl::PermissionDeniedError(
        absl::StrCat("Host \"", shown(host_header),
                     "\" is not served: only IP addresses, localhost and the names in "
                     "--http_allowed_hosts are (a name that is not kilnd's may be a DNS "
                     "rebinding attack)"));
  }
  if (sec_fetch_site == "cross-site") {
    return absl::PermissionDeniedError(
        "a request another site's page made (Sec-Fetch-Site: cross-site) is refused");
  }
  if (!origin.empty() && origin != "null") {
    const std::string scheme_default =
        absl::StartsWithIgnoreCase(std::string(origin), "https:") ? "443" : "80";
    if (WithPort(AuthorityOf(origin), scheme_default) !=
        WithPort(absl::AsciiStrToLower(std::string(host_header)), scheme_default)) {
      return absl::PermissionDeniedError(
          absl::StrCat("Origin \"", shown(origin), "\" is not this server (Host \"",
                       shown(host_header), "\"): a request another site's page made is refused"));
    }
  } else if (origin == "null") {
    return absl::PermissionDeniedError("Origin \"null\" (a sandboxed or file page) is refused");
  }
  return absl::OkStatus();
}

}  // namespace kiln::http
