// Who a browser says sent a request, checked against where it was sent, so that a page of
// another site cannot use a browser on the operator's machine against kilnd: DNS rebinding (a
// name of the attacker's that resolves to kilnd, to read jobs and checkpoints) and cross-site
// requests (a form's text/plain POST that cancels a job). Needed where kilnd asks no token;
// with tokens a browser has nothing to send for the other site.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace kiln::http {

struct OriginPolicy {
  // Host header names (no port) served besides IP literals and "localhost", which are always
  // served: a rebinding attack needs a DNS name of its own. --http_allowed_hosts.
  std::vector<std::string> allowed_hosts;
};

// PermissionDenied naming the header when a browser marks the request as coming from another
// site (an Origin whose host and port differ from the Host header's, Origin "null", or
// Sec-Fetch-Site: cross-site), or, with `check_host_name`, when `host` (the Host header) is a
// name neither allowed nor local. Requests without these headers (curl, Prometheus, the Python
// client) pass.
absl::Status CheckRequestOrigin(std::string_view host, std::string_view origin,
                                std::string_view sec_fetch_site, const OriginPolicy& policy,
                                bool check_host_name);

}  // namespace kiln::http
