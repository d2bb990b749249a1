// A loopback port that closes the first connection it accepts, unanswered, and relays every later
// one to another port: a server that fails one connection attempt and then works, as kilnd looks
// to a client whose gRPC took one in-progress connect for a failed one.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kiln::client::testing {

class FlakyPort {
 public:
  explicit FlakyPort(int target_port);  // listens on 127.0.0.1, a port of its choosing
  ~FlakyPort();                         // stops relaying and closes every connection
  FlakyPort(const FlakyPort&) = delete;
  FlakyPort& operator=(const FlakyPort&) = delete;

  std::string address() const;  // "127.0.0.1:PORT"
  int accepted() const { return accepted_.load(); }

 private:
  void AcceptLoop();
  void Relay(int client);

  const int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  int stop_[2] = {-1, -1};  // a pipe: readable once the destructor runs
  std::atomic<int> accepted_{0};
  std::mutex mu_;
  std::vector<std::thread> relays_;
  std::thread acceptor_;
};

}  // namespace kiln::client::testing
