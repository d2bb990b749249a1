// Child processes for tests: started with posix_spawn, stdin /dev/null, their stdout and stderr
// read into strings as they run; and the one-shot RunCommand.
#pragma once

#include <sys/types.h>

#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"

namespace kiln::testing {

// A child process whose stdout and stderr are read into strings as it runs.
class Subprocess {
 public:
  Subprocess() = default;
  ~Subprocess();  // SIGKILL if still running
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  // Starts argv[0] (a path) with the environment plus `env` ("NAME=value"), stdin /dev/null.
  bool Start(const std::vector<std::string>& argv, const std::vector<std::string>& env = {});
  // Waits up to `timeout` for the exit; returns the exit code, 128+signal when killed by one,
  // or -1 on timeout (the child is then killed).
  int Wait(absl::Duration timeout);
  // True once the child has exited (it is then reaped, and Wait returns its code at once).
  bool Exited();
  void Signal(int signal);
  // What it has written so far.
  std::string Stdout();
  std::string Stderr();
  // Polls until stdout contains `text`; false after `timeout`.
  bool WaitForStdout(const std::string& text, absl::Duration timeout);
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int exit_code_ = -1;
  std::mutex mu_;
  std::string out_, err_;
  std::thread out_reader_, err_reader_;
};

// The outcome of one finished command.
struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs `argv` to its end (at most `timeout`).
RunResult RunCommand(const std::vector<std::string>& argv, const std::vector<std::string>& env = {},
                     absl::Duration timeout = absl::Seconds(60));

}  // namespace kiln::testing
