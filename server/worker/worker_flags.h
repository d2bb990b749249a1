// kiln-worker's command line: every flag also read from an environment variable (the flag wins),
// so that a Kubernetes Indexed Job can configure its pods through the environment alone. The
// worker token is never a flag (command lines are visible to every user of a machine): it comes
// from KILN_WORKER_TOKEN or a file (--token_file, a mounted secret).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln::worker {

struct WorkerFlags {
  std::string coordinator;  // kilnd's gRPC address, HOST:PORT
  std::string job;          // the job's id
  int rank = -1;            // 0-based
  // How long to keep asking to join while kilnd has no attempt taking workers (the job is still
  // queued, or between attempts) or cannot be reached.
  int join_wait_seconds = 60;
  // CPU threads for this rank; 0: what kilnd says (JoinJobResponse.cpu_threads), else every core
  // the process may run on. A container's CPU quota is not among what it sees: set it there.
  int threads = 0;
  std::string token;      // the attempt's worker token
  std::string data_dir;   // a folder holding the dataset's folder; empty: fetch it from kilnd
  std::string cache_dir;  // where fetched datasets go
  // The address this rank listens on for its peers (Gloo), or the interface whose address it
  // takes when set.
  std::string gloo_host = "127.0.0.1";
  std::string gloo_interface;
  // TLS to kilnd, as the kiln CLI's: any of them turns TLS on.
  std::string tls_ca, tls_cert, tls_key, tls_server_name;
  bool help = false;  // --help: print the usage and exit 0
};

// Reads the environment; returns nullopt for an unset variable. Tests pass their own.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup ProcessEnvironment();

// Parses `args` (argv without the program name) over the environment. InvalidArgument with one
// line naming the flag or variable that is wrong or missing. Reads the token file when one is
// named (NotFound/PermissionDenied naming it when it cannot be read).
absl::StatusOr<WorkerFlags> ParseWorkerFlags(const std::vector<std::string>& args,
                                             const EnvLookup& env);

// The --help text.
std::string WorkerUsage();

}  // namespace kiln::worker
