// Test pieces for observability: HTTP GET over libcurl, a free loopback port, a real Prometheus
// server as a child process with its HTTP query API, and a kilnd child that reports both ports.
#pragma once

#include <sys/types.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kiln/v1/training.grpc.pb.h"
#include "tests/support/kilnd_child.h"

namespace kiln::server::testing {

// The body of a 200 answer to GET `url`; an error for anything else.
absl::StatusOr<std::string> HttpGet(const std::string& url);

// The path of a program on PATH, or "" when there is none.
std::string FindProgram(const std::string& name);

// Runs `argv` to completion with stdin from `stdin_file` (may be ""), capturing stdout+stderr.
struct ProgramResult {
  int exit_code = -1;
  std::string output;
};
ProgramResult RunProgram(const std::vector<std::string>& argv, const std::string& stdin_file);

// `prometheus` on 127.0.0.1:<free port>, with temporary storage, scraping `targets`
// ("127.0.0.1:PORT" each, path /metrics) every second.
class PrometheusProcess {
 public:
  PrometheusProcess(std::string binary, std::string dir, std::vector<std::string> targets);
  ~PrometheusProcess();  // SIGTERM, then SIGKILL

  // Starts it and waits until /-/ready answers; false (with log()) otherwise.
  bool Start(absl::Duration timeout);
  // GET /api/v1/query?query=`expr`; the "data" member of a success answer, or the error.
  absl::StatusOr<nlohmann::json> Query(const std::string& expr);
  // Prometheus's own output, for failure messages.
  std::string log() const;
  int port() const { return port_; }

 private:
  std::string binary_, dir_;
  std::vector<std::string> targets_;
  pid_t pid_ = -1;
  int port_ = 0;
};

// kilnd as a child (tests/support/kilnd_child.h) with /metrics on a port of its own.
class KilndWithMetrics : public kiln::testing::KilndChild {
 public:
  KilndWithMetrics(std::string state_dir, std::string data_dir, std::vector<std::string> extra)
      : state_dir_(std::move(state_dir)),
        data_dir_(std::move(data_dir)),
        extra_(std::move(extra)) {}
  bool Start() { return KilndChild::Start(state_dir_, data_dir_, extra_, /*metrics=*/true); }
  std::unique_ptr<v1::Training::Stub> NewStub() const;

 private:
  std::string state_dir_, data_dir_;
  std::vector<std::string> extra_;
};

}  // namespace kiln::server::testing
