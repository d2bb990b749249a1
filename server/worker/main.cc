// kiln-worker: one rank of a data-parallel kiln job (see worker_run.h and --help).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "server/worker/worker_flags.h"
#include "server/worker/worker_run.h"

namespace {

// After SIGTERM the run stops at its next step; one stuck in a wait (a collective, a
// rendezvous) is ended this long after the signal, so a worker never outlives a stop by much.
constexpr auto kStopGrace = std::chrono::seconds(5);

// Waits for SIGTERM or SIGINT on a thread of its own (blocked in every other thread), raises
// `terminate`, and ends the process if the run has not returned within kStopGrace.
void WatchSignals(const sigset_t* signals, std::atomic<bool>* terminate) {
  int received = 0;
  if (sigwait(signals, &received) != 0) return;
  terminate->store(true);
  std::fprintf(stderr, "kiln-worker: %s: stopping\n", received == SIGTERM ? "SIGTERM" : "SIGINT");
  std::this_thread::sleep_for(kStopGrace);
  std::fprintf(stderr, "kiln-worker: still running %lld s after the signal: exiting\n",
               static_cast<long long>(kStopGrace.count()));
  std::fflush(stderr);
  _exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<kiln::worker::WorkerFlags> flags =
      kiln::worker::ParseWorkerFlags(args, kiln::worker::ProcessEnvironment());
  if (!flags.ok()) {
    std::fprintf(stderr, "kiln-worker: %s\n", std::string(flags.status().message()).c_str());
    return 2;
  }
  if (flags->help) {
    std::fputs(kiln::worker::WorkerUsage().c_str(), stdout);
    return 0;
  }

  // Block the stop signals before any thread starts (gRPC's, OpenMP's, Gloo's), so that only the
  // watcher receives them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A peer or kilnd closing a socket must be an error on the write, not the end of the process.
  signal(SIGPIPE, SIG_IGN);
  std::atomic<bool> terminate{false};
  std::thread(WatchSignals, &signals, &terminate).detach();

  absl::Status status = kiln::worker::RunWorker(*flags, terminate);
  if (!status.ok()) {
    std::fprintf(stderr, "kiln-worker: %s\n", std::string(status.message()).c_str());
    std::fflush(nullptr);
    _exit(1);  // not exit(): the signal watcher may still be sleeping; nothing is left to flush
  }
  std::fprintf(stderr, "kiln-worker: rank %d: done\n", flags->rank);
  std::fflush(nullptr);
  _exit(0);
}
