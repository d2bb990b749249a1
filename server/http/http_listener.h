// The HTTP port's accepting side: one thread that accepts connections, finishes their TLS
// handshakes and waits (epoll) for each request's whole head, so that a connection holds no
// request thread while it is idle, handshaking or trickling its head. Only a request whose head
// has arrived whole, within its limits and deadline, is handed on (to the server's request
// lanes); a request thread hands the connection back when its answer is written, to wait for the
// next request.
//
// What it bounds, whatever clients do: connections open at once (at the cap, the one waiting
// longest without a request under way makes room, else the new one is closed), the descriptors
// kept in reserve for files (common/descriptor_budget.h, the gRPC listener's rule), a request
// head's bytes and lines (431 past them), the time a connection may sit idle, and the time a
// request's head (and a TLS handshake) may take from its first byte.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/descriptor_budget.h"
#include "server/http/http_connection.h"
#include "server/http/request_meter.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace kiln::http {

class HttpListener {
 public:
  struct Options {
    ListenerLimits limits;
    RequestMeter::Limits request;
    Clock::duration idle_timeout = std::chrono::seconds(5);
    Clock::duration header_timeout = std::chrono::seconds(10);
    SSL_CTX* tls = nullptr;  // null: plaintext
  };
  // Takes a connection whose request head is in its input, whole and metered.
  using DispatchFn = std::function<void(std::unique_ptr<Connection>)>;
  // Told of each request the listener answers itself (431), with the path when it is known.
  using AnsweredFn = std::function<void(const std::string& path, int status)>;
  // Told of each connection closed on accept: "max_connections" or "descriptors".
  using RefusedFn = std::function<void(const char* reason)>;

  HttpListener(Options options, DispatchFn dispatch, AnsweredFn answered, RefusedFn refused);
  ~HttpListener();  // Stop()
  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;

  // Starts accepting on `listen_fd` (bound and listening; the listener closes it at Stop).
  void Start(int listen_fd);
  // Stops accepting and closes every connection waiting here; connections handed on are their
  // holders' to close (Return closes them from now on). Idempotent.
  void Stop();
  // A request thread gives back a connection whose answer is written whole, to wait for its
  // next request (whose head may have begun: then its meter holds what came, all of the
  // connection's unconsumed input); or, with `linger`, one whose request was answered without
  // being read whole: its writes are shut, and what the client still sends is read and dropped
  // for a moment before it is closed, so that the answer is not lost to the reset a close with
  // unread input sends. Thread-safe.
  void Return(std::unique_ptr<Connection> connection, bool linger = false);

  // Connections open: waiting here, queued, or being answered.
  int open_connections() const { return open_->load(); }

 private:
  struct Waiting;
  void Run();
  void Wake();
  void AcceptAll(Clock::time_point now);
  // Makes room for one more connection: closes the one waiting longest without a request under
  // way (else the one waiting longest). False when none waits here.
  bool Evict();
  // Reads what `w` has sent and hands it on when its head is whole; false when it is closed.
  bool Advance(Waiting& w, Clock::time_point now);
  void Watch(Waiting& w, bool want_write);
  void Close(Connection* key);
  // Answers `w` (431) and lingers on it.
  void AnswerAndLinger(Waiting& w, int status, const std::string& message);
  void Linger(Waiting& w, Clock::time_point now);
  void Place(std::unique_ptr<Connection> c, bool linger, Clock::time_point now);
  void TakeReturned(Clock::time_point now);
  void Sweep(Clock::time_point now);
  std::unique_ptr<Connection> Release(Connection* key);

  const Options options_;
  const DispatchFn dispatch_;
  const AnsweredFn answered_;
  const RefusedFn refused_;
  // Shared with every Connection's closer, which may outlive a Stop()ped listener's thread.
  std::shared_ptr<std::atomic<int>> open_ = std::make_shared<std::atomic<int>>(0);
  int descriptor_limit_ = 0;

  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  Clock::time_point accept_paused_until_{};

  // On the listener's thread only.
  std::unordered_map<Connection*, std::unique_ptr<Waiting>> waiting_;

  std::mutex returned_mu_;
  // Guarded by returned_mu_: connections given back, and whether each lingers.
  std::vector<std::pair<std::unique_ptr<Connection>, bool>> returned_;
  bool stopped_ = false;  // guarded by returned_mu_
};

}  // namespace kiln::http
