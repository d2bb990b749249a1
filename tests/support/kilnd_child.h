// kilnd as a child process of a test, the one launcher of every suite that runs it: loopback ports
// of its choosing (read from the lines it prints), the CPU device, and its stderr (the event log)
// kept for the test to read and shown when the test has failed.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "tests/support/subprocess.h"

namespace kiln::testing {

class KilndChild {
 public:
  KilndChild() = default;
  ~KilndChild();  // prints the event log if the test has failed; SIGKILL if still running
  KilndChild(const KilndChild&) = delete;
  KilndChild& operator=(const KilndChild&) = delete;

  // Runs `path` instead of the kilnd of this build (e.g. an older one, to compare).
  void set_binary(std::string path) { binary_ = std::move(path); }
  // Starts kilnd with --listen=127.0.0.1:0, the two folders, --device=cpu and /metrics on a port
  // of its own (`metrics`) or off, then `extra_args` (later flags win). False when it does not
  // report its ports within 30 s.
  bool Start(const std::string& state_dir, const std::string& data_dir,
             const std::vector<std::string>& extra_args = {}, bool metrics = false);
  // Runs kilnd through `prefix` (e.g. {"/usr/bin/prlimit", "--nofile=256:256", "--"}), which
  // must exec it in place, so pid() stays kilnd's. Applies to later Starts.
  void set_launcher(std::vector<std::string> prefix) { launcher_ = std::move(prefix); }
  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }  // 0 without /metrics
  std::string address() const;                        // 127.0.0.1:PORT
  pid_t pid() const { return process_.pid(); }        // -1 once it has exited and been reaped

  std::string Stderr() { return process_.Stderr(); }
  std::string Stdout() { return process_.Stdout(); }
  // Polls until stderr holds `text` `count` times or more; false after `timeout`.
  bool WaitForStderr(const std::string& text, int count, absl::Duration timeout);
  void Signal(int signal) { process_.Signal(signal); }
  // Sends `signal` and waits up to `timeout` for the exit: its exit code, 128+N when signal N
  // ended it, or -1 on timeout (it is then killed).
  int Stop(int signal, absl::Duration timeout);

 private:
  Subprocess process_;
  std::vector<std::string> launcher_;
  std::string binary_;  // empty: this build's kilnd
  int port_ = 0;
  int metrics_port_ = 0;
};

}  // namespace kiln::testing
