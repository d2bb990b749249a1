#include "client/interrupt.h"

#include <pthread.h>
#include <signal.h>

#include <cstdlib>
#include <mutex>
#include <thread>

namespace kiln::client {
namespace {

std::mutex& HandlerMutex() {
  static std::mutex mu;
  return mu;
}

std::function<void()>& Handler() {
  static std::function<void()> handler;
  return handler;
}

sigset_t StopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

void InstallInterruptHandling() {
  sigset_t set = StopSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    for (;;) {
      int signal_number = 0;
      if (sigwait(&set, &signal_number) != 0) continue;
      std::function<void()> handler;
      {
        std::lock_guard<std::mutex> lock(HandlerMutex());
        handler.swap(Handler());
      }
      if (!handler) std::_Exit(128 + signal_number);
      handler();
    }
  }).detach();
}

ScopedInterruptHandler::ScopedInterruptHandler(std::function<void()> handler) {
  std::lock_guard<std::mutex> lock(HandlerMutex());
  Handler() = std::move(handler);
}

ScopedInterruptHandler::~ScopedInterruptHandler() {
  std::lock_guard<std::mutex> lock(HandlerMutex());
  Handler() = nullptr;
}

}  // namespace kiln::client
