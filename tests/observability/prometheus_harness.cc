#include "prometheus_harness.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tests/support/connected_channel.h"
#include "tests/support/loopback_port.h"

extern char** environ;

namespace kiln::server::testing {
namespace fs = std::filesystem;
namespace {

size_t AppendToString(char* data, size_t size, size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Spawns argv with stdout and stderr going to `out_path`.
pid_t Spawn(const std::vector<std::string>& args, const std::string& out_path,
            const std::string& stdin_path) {
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, out_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);
  posix_spawn_file_actions_addopen(
      &actions, STDIN_FILENO, stdin_path.empty() ? "/dev/null" : stdin_path.c_str(), O_RDONLY, 0);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  return rc == 0 ? pid : -1;
}

// SIGTERM, then SIGKILL after `grace`; returns the waitpid status or -1.
int StopChild(pid_t pid, absl::Duration grace) {
  if (pid <= 0) return -1;
  kill(pid, SIGTERM);
  const absl::Time end = absl::Now() + grace;
  int status = 0;
  while (absl::Now() < end) {
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    absl::SleepFor(absl::Milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

}  // namespace

absl::StatusOr<std::string> HttpGet(const std::string& url) {
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return absl::InternalError("curl_easy_init failed");
  std::string body;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &AppendToString);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, 10L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  const CURLcode rc = curl_easy_perform(curl);
  long code = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
  curl_easy_cleanup(curl);
  if (rc != CURLE_OK) {
    return absl::UnavailableError(absl::StrCat("GET ", url, ": ", curl_easy_strerror(rc)));
  }
  if (code != 200) {
    return absl::UnknownError(absl::StrCat("GET ", url, ": HTTP ", code, ": ", body));
  }
  return body;
}

std::string FindProgram(const std::string& name) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':')) {
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

ProgramResult RunProgram(const std::vector<std::string>& argv, const std::string& stdin_file) {
  ProgramResult result;
  char pattern[] = "/tmp/kiln-run-XXXXXX";
  const int fd = mkstemp(pattern);
  if (fd < 0) return result;
  close(fd);
  const pid_t pid = Spawn(argv, pattern, stdin_file);
  if (pid > 0) {
    int status = 0;
    waitpid(pid, &status, 0);
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  result.output = ReadFile(pattern);
  std::remove(pattern);
  return result;
}

PrometheusProcess::PrometheusProcess(std::string binary, std::string dir,
                                     std::vector<std::string> targets)
    : binary_(std::move(binary)), dir_(std::move(dir)), targets_(std::move(targets)) {}

PrometheusProcess::~PrometheusProcess() { StopChild(pid_, absl::Seconds(10)); }

bool PrometheusProcess::Start(absl::Duration timeout) {
  fs::create_directories(dir_ + "/data");
  std::vector<std::string> quoted;
  for (const std::string& t : targets_) quoted.push_back(absl::StrCat("\"", t, "\""));
  // As deploy/prometheus/prometheus.yml: job kilnd, without honor_labels (kilnd sets no `job`).
  std::ofstream(dir_ + "/prometheus.yml")
      << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
      << "scrape_configs:\n  - job_name: kilnd\n    scrape_interval: 1s\n"
      << "    scrape_timeout: 1s\n    static_configs:\n      - targets: ["
      << absl::StrJoin(quoted, ", ") << "]\n";
  // The port is picked then bound by the child; a lost race is retried with another.
  for (int attempt = 0; attempt < 3; ++attempt) {
    port_ = kiln::testing::UnusedLoopbackPort();
    pid_ = Spawn({binary_, "--config.file=" + dir_ + "/prometheus.yml",
                  "--storage.tsdb.path=" + dir_ + "/data",
                  absl::StrCat("--web.listen-address=127.0.0.1:", port_),
                  "--storage.tsdb.retention.time=1h", "--log.level=warn"},
                 dir_ + "/prometheus.log", "");
    if (pid_ <= 0) return false;
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      if (HttpGet(absl::StrCat("http://127.0.0.1:", port_, "/-/ready")).ok()) return true;
      absl::SleepFor(absl::Milliseconds(100));
    }
    if (pid_ > 0) {
      StopChild(pid_, absl::Seconds(5));
      pid_ = -1;
      return false;
    }
  }
  return false;
}

absl::StatusOr<nlohmann::json> PrometheusProcess::Query(const std::string& expr) {
  CURL* curl = curl_easy_init();
  char* escaped = curl_easy_escape(curl, expr.c_str(), static_cast<int>(expr.size()));
  const std::string url = absl::StrCat("http://127.0.0.1:", port_, "/api/v1/query?query=", escaped);
  curl_free(escaped);
  curl_easy_cleanup(curl);
  std::string body;
  absl::StatusOr<std::string> got = HttpGet(url);
  // A bad expression is HTTP 400 with a JSON error; keep the body for the message.
  if (!got.ok())
    return absl::Status(got.status().code(), absl::StrCat(expr, ": ", got.status().message()));
  nlohmann::json answer = nlohmann::json::parse(*got, nullptr, /*allow_exceptions=*/false);
  if (answer.is_discarded() || answer.value("status", "") != "success") {
    return absl::UnknownError(absl::StrCat(expr, ": ", *got));
  }
  return answer["data"];
}

std::string PrometheusProcess::log() const { return ReadFile(dir_ + "/prometheus.log"); }

std::unique_ptr<v1::Training::Stub> KilndWithMetrics::NewStub() const {
  return v1::Training::NewStub(kiln::testing::ConnectedChannel(address()));
}

}  // namespace kiln::server::testing
