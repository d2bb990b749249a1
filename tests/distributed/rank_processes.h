// Runs the ranks of a test job as forked child processes on this machine and waits for them with
// a deadline, so that a hang fails the test instead of stalling ctest. The parent must run no
// engine code before forking (OpenMP's thread pool does not survive fork); each child runs
// `body(rank)` and exits with its result, skipping the parent's gtest teardown.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <thread>
#include <vector>

namespace kiln::testing {

struct RankExit {
  int exit_code = -1;  // when it exited
  int signal = 0;      // when a signal ended it
  bool timed_out = false;
  double seconds = 0;  // from the start to its end
};

inline std::vector<RankExit> RunRanks(int size, const std::function<int(int rank)>& body,
                                      double deadline_seconds = 60) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  std::fflush(nullptr);  // nothing buffered is written twice
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      // As kiln-worker: a write to a dead rank's socket is an error Gloo reports, not the end
      // of this one. (Without it, a surviving rank of the kill tests was seen ended by a signal
      // with no status written, 2 times in 10 runs of the suite; SIGPIPE is the likely one.)
      signal(SIGPIPE, SIG_IGN);
      const int code = body(r);
      std::fflush(nullptr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<RankExit> exits(size);
  int running = size;
  while (running > 0) {
    for (int r = 0; r < size; ++r) {
      if (pids[r] <= 0) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      exits[r].seconds = std::chrono::duration<double>(Clock::now() - start).count();
      if (WIFEXITED(status)) exits[r].exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) exits[r].signal = WTERMSIG(status);
      pids[r] = 0;
      --running;
    }
    if (running > 0 &&
        std::chrono::duration<double>(Clock::now() - start).count() > deadline_seconds) {
      for (int r = 0; r < size; ++r) {
        if (pids[r] <= 0) continue;
        kill(pids[r], SIGKILL);
        waitpid(pids[r], nullptr, 0);
        exits[r].timed_out = true;
        exits[r].seconds = deadline_seconds;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return exits;
}

}  // namespace kiln::testing
