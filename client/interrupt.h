// Ctrl-C handling: a thread takes SIGINT and SIGTERM and runs the handler a command registered
// (a watch detaches), or ends the process with status 130 when none is registered.
#pragma once

#include <functional>

namespace kiln::client {

// Blocks SIGINT and SIGTERM in the calling thread (and so in every thread created after it) and
// starts the thread that waits for them. Call once, first thing in main.
void InstallInterruptHandling();

// Registers `handler` for the next interrupt while in scope; a second interrupt, or one after
// the handler ran, ends the process. The handler runs on the signal thread.
class ScopedInterruptHandler {
 public:
  explicit ScopedInterruptHandler(std::function<void()> handler);
  ~ScopedInterruptHandler();
  ScopedInterruptHandler(const ScopedInterruptHandler&) = delete;
  ScopedInterruptHandler& operator=(const ScopedInterruptHandler&) = delete;
};

}  // namespace kiln::client
