// One accepted connection of the HTTP listener (plain or TLS, its socket non-blocking), with the
// bytes read from it and not yet consumed, and the httplib::Stream a request thread reads and
// writes it through: reads pass the RequestMeter, so that httplib never gets a byte of a request
// past its limits, and every read and write waits with poll() against deadlines (a whole-request
// deadline for the body, a progress timeout for each write), never blocking without end.
#pragma once

#include <httplib.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "server/http/request_meter.h"

typedef struct ssl_st SSL;

namespace kiln::http {

using Clock = std::chrono::steady_clock;

// The whole text of an answer to a request the connection is closed after (431, 503): `status`,
// a JSON body {"error": message}, `extra_headers` (each line ending in CRLF) and Connection: close.
std::string ClosingAnswer(int status, std::string_view message,
                          std::string_view extra_headers = "");

class Connection {
 public:
  // Takes `fd` (and `ssl`, when set up on it) and closes them when destroyed; `open`, when set,
  // counts it among the connections open until then.
  Connection(int fd, SSL* ssl, std::shared_ptr<std::atomic<int>> open = nullptr)
      : fd_(fd), ssl_(ssl), open_(std::move(open)) {
    if (open_ != nullptr) open_->fetch_add(1);
  }
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  int fd() const { return fd_; }
  SSL* ssl() const { return ssl_; }

  // What one non-blocking step of I/O did.
  enum class Io { kDone, kWantRead, kWantWrite, kClosed, kError };
  // Continues the TLS handshake (kDone once complete).
  Io Handshake();
  // Reads what is there, up to `most` bytes, onto input(); kDone when some arrived.
  Io ReadSome(size_t most);
  // Writes up to `n` bytes; `*written` says how many went out.
  Io WriteSome(const char* data, size_t n, size_t* written);
  // Waits until the socket is ready for `events` (POLLIN, POLLOUT) or `deadline` passes.
  bool Wait(short events, Clock::time_point deadline) const;
  // Writes what it can of `text` without waiting (an answer to a connection about to close).
  void WriteWithoutWaiting(const std::string& text);
  // Makes every blocked or later read and write on it fail at once (another thread may call it).
  void Shutdown() const;
  // Ends what it sends (TLS: with close_notify); reading goes on.
  void ShutdownWrites();
  // Makes the close drop what is still queued for the client and reset the connection: a client
  // cut for not reading keeps neither the answer's rest nor the kernel's memory for it.
  void ResetOnClose() const;
  // Asks the TLS peer to close cleanly when destroyed (after a request answered whole).
  void set_clean_close(bool clean) { clean_close_ = clean; }

  // Bytes read and not yet consumed: input()[consumed()..].
  std::string& input() { return input_; }
  size_t consumed() const { return consumed_; }
  size_t unconsumed() const { return input_.size() - consumed_; }
  void Consume(size_t n);

  // The request arriving or being answered; reset for each request.
  std::optional<RequestMeter> meter;
  Clock::time_point request_start;  // its first byte
  size_t head_left = 0;             // bytes of its head in input() not yet given to httplib
  int requests = 0;                 // answered on this connection

 private:
  const int fd_;
  SSL* const ssl_;
  const std::shared_ptr<std::atomic<int>> open_;
  bool clean_close_ = false;
  std::string input_;
  size_t consumed_ = 0;
};

// The stream httplib answers one request through, on a request thread.
class ConnectionStream : public httplib::Stream {
 public:
  struct Timeouts {
    Clock::time_point body_deadline;  // the whole body by then
    Clock::duration io_timeout;       // each read and write must progress within it
    // When set, the whole answer must be written within it of its first write.
    std::optional<Clock::duration> answer_timeout;
    // A client that reads slowly or not at all is cut once the answer's writes have waited on
    // it longer than write_wait_grace plus one second per min_read_rate bytes written: a
    // trickling reader cannot hold a thread, whatever each write's progress.
    Clock::duration write_wait_grace = std::chrono::seconds(10);
    int64_t min_read_rate = 64 << 10;  // bytes per second
  };
  ConnectionStream(Connection& connection, Timeouts timeouts)
      : c_(connection), timeouts_(timeouts) {}

  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  int socket() const override { return c_.fd(); }

  // Why the body stopped: its deadline passed (408), rather than a limit or the client.
  bool timed_out() const { return timed_out_; }
  // A write failed: the client has gone or stopped reading; the answer is cut.
  bool write_failed() const { return write_failed_; }

 private:
  // Waits for more input; false (and timed_out_ when so) when none comes in time.
  bool Fill();
  // How much longer this answer's writes may wait on the client (zero: none).
  Clock::duration WriteWaitLeft() const;

  Connection& c_;
  const Timeouts timeouts_;
  std::optional<Clock::time_point> answer_deadline_;
  Clock::duration write_waited_{};  // time this answer's writes spent waiting on the client
  int64_t written_ = 0;             // bytes of this answer written
  bool timed_out_ = false;
  bool write_failed_ = false;
};

}  // namespace kiln::http
