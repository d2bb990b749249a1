#include "server/worker/worker_flags.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kiln::worker {
namespace {

// A string flag and the environment variables it falls back to, in order.
struct StringFlag {
  const char* name;
  std::vector<const char*> env;
  std::string WorkerFlags::*field;
};

const std::vector<StringFlag>& StringFlags() {
  static const std::vector<StringFlag> flags = {
      {"coordinator", {"KILN_COORDINATOR"}, &WorkerFlags::coordinator},
      {"job", {"KILN_JOB"}, &WorkerFlags::job},
      {"data_dir", {"KILN_DATA_DIR"}, &WorkerFlags::data_dir},
      {"cache_dir", {"KILN_CACHE_DIR"}, &WorkerFlags::cache_dir},
      {"gloo_host", {"KILN_GLOO_HOST"}, &WorkerFlags::gloo_host},
      {"gloo_interface", {"KILN_GLOO_INTERFACE"}, &WorkerFlags::gloo_interface},
      {"tls_ca", {"KILN_TLS_CA"}, &WorkerFlags::tls_ca},
      {"tls_cert", {"KILN_TLS_CERT"}, &WorkerFlags::tls_cert},
      {"tls_key", {"KILN_TLS_KEY"}, &WorkerFlags::tls_key},
      {"tls_server_name", {"KILN_TLS_SERVER_NAME"}, &WorkerFlags::tls_server_name},
  };
  return flags;
}

// Flags that are not plain strings: --rank (an integer) and --token_file (read into `token`).
constexpr const char* kRankFlag = "rank";
constexpr const char* kJoinWaitFlag = "join_wait";
constexpr const char* kThreadsFlag = "threads";
constexpr const char* kTokenFileFlag = "token_file";

absl::StatusOr<std::string> ReadTokenFile(const std::string& where, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": cannot read the worker token file ", path));
  }
  std::ostringstream text;
  text << in.rdbuf();
  // A mounted secret or `echo TOKEN > file` may end in a newline; a token never holds space.
  std::string token(absl::StripAsciiWhitespace(text.str()));
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the worker token file ", path, " is empty"));
  }
  return token;
}

}  // namespace

EnvLookup ProcessEnvironment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

absl::StatusOr<WorkerFlags> ParseWorkerFlags(const std::vector<std::string>& args,
                                             const EnvLookup& env) {
  std::map<std::string, std::string> given;  // flag name -> value, from the command line
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      WorkerFlags help;
      help.help = true;
      return help;
    }
    if (!absl::StartsWith(arg, "--") || arg.size() == 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument \"", arg, "\" (flags are --name VALUE; see --help)"));
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (name == "token") {
      return absl::InvalidArgumentError(
          "--token: the worker token is never a flag (others can read a command line); set "
          "KILN_WORKER_TOKEN or pass --token_file FILE");
    }
    bool known = name == kRankFlag || name == kTokenFileFlag || name == kJoinWaitFlag ||
                 name == kThreadsFlag;
    for (const StringFlag& f : StringFlags()) known = known || name == f.name;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (see --help)"));
    }
    if (!has_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      value = args[++i];
    }
    given[name] = value;
  }

  // The flag when given, else the first environment variable set; where says which it was.
  auto lookup = [&](const std::string& name, const std::vector<const char*>& vars,
                    std::string* where) -> std::optional<std::string> {
    if (auto it = given.find(name); it != given.end()) {
      *where = "--" + name;
      return it->second;
    }
    for (const char* var : vars) {
      if (std::optional<std::string> value = env(var); value.has_value()) {
        *where = var;
        return value;
      }
    }
    return std::nullopt;
  };

  WorkerFlags flags;
  for (const StringFlag& f : StringFlags()) {
    std::string where;
    if (std::optional<std::string> value = lookup(f.name, f.env, &where); value.has_value()) {
      if (value->empty() && f.field != &WorkerFlags::data_dir) {
        return absl::InvalidArgumentError(absl::StrCat(where, " is empty"));
      }
      flags.*f.field = *value;
    }
  }
  if (flags.coordinator.empty()) {
    return absl::InvalidArgumentError(
        "--coordinator (or KILN_COORDINATOR) is required: kilnd's gRPC address, HOST:PORT");
  }
  if (flags.coordinator.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--coordinator \"", flags.coordinator, "\" is not HOST:PORT"));
  }
  if (flags.job.empty()) {
    return absl::InvalidArgumentError("--job (or KILN_JOB) is required: the job's id");
  }

  std::string where;
  const std::optional<std::string> rank =
      lookup(kRankFlag, {"KILN_RANK", "JOB_COMPLETION_INDEX"}, &where);
  if (!rank.has_value()) {
    return absl::InvalidArgumentError(
        "--rank (or KILN_RANK, or JOB_COMPLETION_INDEX) is required: this worker's 0-based rank");
  }
  if (!absl::SimpleAtoi(*rank, &flags.rank) || flags.rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " \"", *rank, "\" is not a rank (an integer from 0)"));
  }

  // Integer flags from 0: `what` says what the number counts, for the message.
  auto count_flag = [&](const char* name, const char* var, const char* what,
                        int* out) -> absl::Status {
    std::string where;
    const std::optional<std::string> value = lookup(name, {var}, &where);
    if (!value.has_value()) return absl::OkStatus();
    if (!absl::SimpleAtoi(*value, out) || *out < 0) {
      return absl::InvalidArgumentError(absl::StrCat(where, " \"", *value, "\" is not a number of ",
                                                     what, " (an integer from 0)"));
    }
    return absl::OkStatus();
  };
  if (absl::Status s =
          count_flag(kJoinWaitFlag, "KILN_JOIN_WAIT", "seconds", &flags.join_wait_seconds);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = count_flag(kThreadsFlag, "KILN_THREADS", "threads", &flags.threads);
      !s.ok()) {
    return s;
  }

  if (std::optional<std::string> file = lookup(kTokenFileFlag, {}, &where); file.has_value()) {
    absl::StatusOr<std::string> token = ReadTokenFile(where, *file);
    if (!token.ok()) return token.status();
    flags.token = *token;
  } else if (std::optional<std::string> token = env("KILN_WORKER_TOKEN"); token.has_value()) {
    flags.token = std::string(absl::StripAsciiWhitespace(*token));
    if (flags.token.empty()) return absl::InvalidArgumentError("KILN_WORKER_TOKEN is empty");
  } else if (std::optional<std::string> file = env("KILN_WORKER_TOKEN_FILE"); file.has_value()) {
    absl::StatusOr<std::string> token = ReadTokenFile("KILN_WORKER_TOKEN_FILE", *file);
    if (!token.ok()) return token.status();
    flags.token = *token;
  } else {
    return absl::InvalidArgumentError(
        "no worker token: set KILN_WORKER_TOKEN or pass --token_file FILE (kiln worker-token JOB "
        "prints it)");
  }

  if (flags.cache_dir.empty()) {
    const std::optional<std::string> tmp = env("TMPDIR");
    flags.cache_dir =
        absl::StrCat(tmp.has_value() && !tmp->empty() ? *tmp : "/tmp", "/kiln-worker-cache");
  }
  if (flags.tls_cert.empty() != flags.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together: the client certificate and its private key");
  }
  return flags;
}

std::string WorkerUsage() {
  return R"(kiln-worker: one rank of a data-parallel kiln job, coordinated by kilnd.

Usage: kiln-worker --coordinator HOST:PORT --job JOB_ID --rank R [flags]

Every flag may instead come from the environment variable beside it; a flag wins.
  --coordinator HOST:PORT  KILN_COORDINATOR   kilnd's gRPC address
  --job ID                 KILN_JOB           the job to join
  --rank R                 KILN_RANK, then JOB_COMPLETION_INDEX (a Kubernetes Indexed Job's)
                                              this worker's 0-based rank
  --token_file FILE        KILN_WORKER_TOKEN_FILE
                                              a file holding the job's worker token; or the
                                              token itself in KILN_WORKER_TOKEN (never a flag).
                                              `kiln worker-token JOB` prints it.
  --data_dir DIR           KILN_DATA_DIR      a folder holding the dataset's folder; when the
                                              dataset is not there, it is fetched from kilnd
  --cache_dir DIR          KILN_CACHE_DIR     where fetched datasets go
                                              (default $TMPDIR/kiln-worker-cache)
  --join_wait SECONDS      KILN_JOIN_WAIT     how long to keep asking to join while the job is
                                              not taking workers yet (default 60)
  --threads N              KILN_THREADS       CPU threads for this rank (default: kilnd's share,
                                              else every core; set it under a CPU quota)
  --gloo_host ADDR         KILN_GLOO_HOST     the address this rank listens on for its peers
                                              (default 127.0.0.1: every rank on one machine)
  --gloo_interface NAME    KILN_GLOO_INTERFACE
                                              or the network interface whose address to use
  --tls_ca FILE            KILN_TLS_CA        TLS to kilnd: the CA of its certificate
  --tls_cert FILE          KILN_TLS_CERT      a client certificate (mutual TLS), with
  --tls_key FILE           KILN_TLS_KEY       its private key
  --tls_server_name NAME   KILN_TLS_SERVER_NAME
                                              the name kilnd's certificate must hold
  --help                                      this text

Exit status: 0 when the job's training finished, 1 when it failed (the reason is reported to
kilnd and printed), 2 for bad flags.
)";
}

}  // namespace kiln::worker
