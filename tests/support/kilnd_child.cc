#include "tests/support/kilnd_child.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kiln::testing {

KilndChild::~KilndChild() {
  if (pid() > 0) {
    process_.Signal(SIGKILL);
    process_.Wait(absl::Seconds(10));
  }
  if (::testing::Test::HasFailure()) {
    std::fprintf(stderr, "--- kilnd's event log (port %d) ---\n%s--- end of kilnd's log ---\n",
                 port_, process_.Stderr().c_str());
  }
}

bool KilndChild::Start(const std::string& state_dir, const std::string& data_dir,
                       const std::vector<std::string>& extra_args, bool metrics) {
  std::vector<std::string> args = launcher_;
  args.insert(args.end(),
              {binary_.empty() ? std::string(KILND_PATH) : binary_, "--listen=127.0.0.1:0",
               metrics ? "--metrics_listen=127.0.0.1:0" : "--metrics_listen=",
               "--state_dir=" + state_dir, "--data_dir=" + data_dir, "--device=cpu"});
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  port_ = metrics_port_ = 0;
  if (!process_.Start(args)) return false;
  // "kilnd: listening on port N", then with /metrics "kilnd: metrics on port M".
  const size_t lines_wanted = metrics ? 2 : 1;
  const absl::Time end = absl::Now() + absl::Seconds(30);
  while (absl::Now() < end && !process_.Exited()) {
    const std::string out = process_.Stdout();
    if (static_cast<size_t>(std::count(out.begin(), out.end(), '\n')) >= lines_wanted) {
      const std::string second = out.substr(out.find('\n') + 1);
      // Text ("kilnd: listening on port N") or, with --log_format json, the events'
      // {"ts":...,"level":"info","event":"listening","port":N}.
      const auto port_of = [](const std::string& line, const char* text, const char* event,
                              int* port) {
        if (std::sscanf(line.c_str(), text, port) == 1) return true;
        const size_t at = line.find(event);
        const size_t first_line_end = line.find('\n');
        if (at == std::string::npos || at > first_line_end) return false;
        const size_t p = line.find("\"port\":", at);
        return p != std::string::npos && p < first_line_end &&
               std::sscanf(line.c_str() + p, "\"port\":%d", port) == 1;
      };
      const bool listening =
          port_of(out, "kilnd: listening on port %d", "\"event\":\"listening\"", &port_);
      return listening && (!metrics || port_of(second, "kilnd: metrics on port %d",
                                               "\"event\":\"metrics_listening\"", &metrics_port_));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

std::string KilndChild::address() const { return absl::StrCat("127.0.0.1:", port_); }

bool KilndChild::WaitForStderr(const std::string& text, int count, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  for (;;) {
    const std::string err = process_.Stderr();
    int found = 0;
    for (size_t at = err.find(text); at != std::string::npos; at = err.find(text, at + 1)) ++found;
    if (found >= count) return true;
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
}

int KilndChild::Stop(int signal, absl::Duration timeout) {
  process_.Signal(signal);
  return process_.Wait(timeout);
}

}  // namespace kiln::testing
