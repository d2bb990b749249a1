// A minimal HTTP/1.1 endpoint for Prometheus scrapes (GET /metrics): a thread accepts, and each
// connection is answered on a thread of its own (8 at once at most), its request due within 5 s.
//
// Why not prometheus-cpp's civetweb Exposer: civetweb's threads get a fixed 100 KiB stack, of
// which OpenBLAS's static TLS alone takes 60 KiB; the rest is too little to serialise a scrape,
// and the overflow killed kilnd. This server's thread has a normal stack.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace kiln::server {

class MetricsHttpServer {
 public:
  // `body` produces the text exposition for each scrape; called on the server's thread.
  explicit MetricsHttpServer(std::function<std::string()> body) : body_(std::move(body)) {}
  ~MetricsHttpServer() { Stop(); }
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // Binds HOST:PORT ("127.0.0.1:9464", "[::1]:0"; port 0 picks one) and starts answering.
  // Returns the port bound; Unavailable naming the address when it cannot bind.
  absl::StatusOr<int> Start(const std::string& listen);
  // Stops answering and joins the thread; idempotent.
  void Stop();

 private:
  void Serve();
  void Answer(int fd);

  std::function<std::string()> body_;
  int listen_fd_ = -1;
  int wake_fd_[2] = {-1, -1};  // a pipe: a byte on it ends Serve()
  std::thread thread_;
  // Connections being answered, each on a thread of its own (Stop waits for them).
  std::mutex mu_;
  std::condition_variable idle_;
  int answering_ = 0;  // guarded by mu_
};

}  // namespace kiln::server
