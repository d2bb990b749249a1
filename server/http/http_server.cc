#include "server/http/http_server.h"

#include <httplib.h>
#include <pthread.h>
#include <sys/socket.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/http/http_tls.h"

namespace kiln::http {
namespace {

// Each read and write of a connection must progress within this; an idle keep-alive
// connection is closed after it too.
constexpr int kIoTimeoutSeconds = 5;
constexpr int kKeepAliveRequests = 100;

// When the request this thread is answering arrived (its head), for on_request.
thread_local std::optional<std::chrono::steady_clock::time_point> request_start;

// httplib's ThreadPool, with threads named for top -H and perf.
class NamedThreadPool : public httplib::TaskQueue {
 public:
  explicit NamedThreadPool(int n) {
    for (int i = 0; i < n; ++i) {
      threads_.emplace_back([this] { Work(); });
      pthread_setname_np(threads_.back().native_handle(), "kiln-http");
    }
  }
  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }
  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

 private:
  void Work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;  // stopping, and every accepted connection answered
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// Splits "HOST:PORT" or "[HOST]:PORT".
bool SplitHostPort(const std::string& listen, std::string* host, int* port) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon + 1 == listen.size()) return false;
  *host = listen.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return absl::SimpleAtoi(listen.substr(colon + 1), port) && *port >= 0 && *port <= 65535;
}

// What httplib answers by itself (no route, a body over the limit, a request it cannot parse)
// gets a JSON body like every other error.
std::string DefaultMessage(const httplib::Request& req, int status, size_t max_body_bytes) {
  switch (status) {
    case 404:
      return absl::StrCat(
          "no route for ", req.method, " ", req.path,
          "; kilnd serves /metrics, the KServe v2 API under /v2, and its web page at / ",
          "with its API under /api");
    case 413:
      return absl::StrCat("the request body is over the limit of ", max_body_bytes,
                          " bytes (--max_message_bytes)");
    case 400:
      return "malformed HTTP request";
    default:
      return absl::StrCat("HTTP ", status);
  }
}

}  // namespace

void ReplyError(httplib::Response& res, int status, std::string_view message) {
  res.status = status;
  // Replaced, not thrown on: a message may echo bytes a client sent that are not UTF-8.
  res.set_content(nlohmann::json{{"error", std::string(message)}}.dump(
                      -1, ' ', false, nlohmann::json::error_handler_t::replace),
                  "application/json");
}

HttpServer::HttpServer(HttpServerOptions options) : options_(std::move(options)) {
  if (options_.tls) {
    tls_ = std::make_unique<TlsHandshakeIdentity>(options_.tls);
    // The setup callback only records the context; Start installs the identity, so that a set
    // that does not load is an error there rather than a server without a certificate.
    server_ = std::make_unique<httplib::SSLServer>([](SSL_CTX&) { return true; });
  } else {
    server_ = std::make_unique<httplib::Server>();
  }
  const int threads = options_.threads;
  server_->new_task_queue = [threads] { return new NamedThreadPool(threads); };
  server_->set_read_timeout(kIoTimeoutSeconds, 0);
  server_->set_write_timeout(kIoTimeoutSeconds, 0);
  server_->set_keep_alive_timeout(kIoTimeoutSeconds);
  // A connection holds a thread while it is kept alive: after this many requests it is closed,
  // so a queued connection gets its turn (httplib's default is 5, a new connection per 5 calls).
  server_->set_keep_alive_max_count(kKeepAliveRequests);
  server_->set_payload_max_length(options_.max_body_bytes);
  // httplib writes a response's head and body apart: with Nagle's algorithm on, the body waits
  // for the client's delayed ACK, 40 ms a request on Linux.
  server_->set_tcp_nodelay(true);
  // httplib's default sets SO_REUSEPORT, which would let a second kilnd bind the same port
  // and take half its connections; SO_REUSEADDR alone only allows a quick restart.
  server_->set_socket_options([](int sock) {
    const int one = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  });
  const size_t max_body = options_.max_body_bytes;
  server_->set_error_handler(httplib::Server::HandlerWithResponse(
      [max_body](const httplib::Request& req, httplib::Response& res) {
        // Readiness answers "no" by status alone, with the empty body the protocol asks for.
        const bool readiness = absl::EndsWith(req.path, "/ready");
        if (!res.body.empty() || readiness) return httplib::Server::HandlerResponse::Unhandled;
        ReplyError(res, res.status, DefaultMessage(req, res.status, max_body));
        return httplib::Server::HandlerResponse::Handled;
      }));
  if (options_.on_request) {
    // A connection is answered on one thread, a request at a time: the start of the request
    // being answered is the thread's.
    server_->set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
      request_start = std::chrono::steady_clock::now();
      return httplib::Server::HandlerResponse::Unhandled;
    });
    server_->set_logger([on_request = options_.on_request](const httplib::Request& req,
                                                           const httplib::Response& res) {
      const auto now = std::chrono::steady_clock::now();
      // A request httplib refused before routing (a malformed head) has no start of its own.
      const double seconds = request_start.has_value()
                                 ? std::chrono::duration<double>(now - *request_start).count()
                                 : 0.0;
      request_start.reset();
      on_request(req.path, res.status, seconds);
    });
  }
  server_->set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, const std::exception_ptr&) {
        ReplyError(res, 500, "internal error");
      });
}

HttpServer::~HttpServer() { Stop(); }

HttpServer::Handler HttpServer::Guarded(Access access, Handler handler) const {
  return [this, access, handler = std::move(handler)](const httplib::Request& req,
                                                      httplib::Response& res) {
    // With tokens a rebinding page has none to send: only cross-site requests are refused then.
    const std::string host = req.get_header_value("Host");
    const std::string origin_header = req.get_header_value("Origin");
    const std::string fetch_site = req.get_header_value("Sec-Fetch-Site");
    if (absl::Status origin = CheckRequestOrigin(host, origin_header, fetch_site, options_.origin,
                                                 /*check_host_name=*/!options_.authorize);
        !origin.ok()) {
      res.set_header("Connection", "close");
      ReplyError(res, 403, std::string(origin.message()));
      return;
    }
    if (access == Access::kToken && options_.authorize) {
      std::vector<std::string_view> values;
      const auto [begin, end] = req.headers.equal_range("Authorization");
      for (auto it = begin; it != end; ++it) values.emplace_back(it->second);
      absl::Status allowed = options_.authorize(values);
      if (!allowed.ok()) {
        res.set_header("WWW-Authenticate", "Bearer");
        ReplyError(res, 401, std::string(allowed.message()));
        return;
      }
    }
    // No exception leaves a handler: one that escapes is this request's 500, not kilnd's end.
    try {
      handler(req, res);
    } catch (const std::exception& e) {
      ReplyError(res, 500, absl::StrCat("internal error: ", e.what()));
    } catch (...) {
      ReplyError(res, 500, "internal error");
    }
  };
}

void HttpServer::Get(const std::string& pattern, Access access, Handler handler) {
  server_->Get(pattern, Guarded(access, std::move(handler)));
}

void HttpServer::Post(const std::string& pattern, Access access, Handler handler) {
  // The body is read here, whatever its Content-Type: httplib would parse a form body
  // (curl -d's default type) as a form and refuse one over 8 KiB.
  const size_t max_body = options_.max_body_bytes;
  server_->Post(pattern, [max_body, guarded = Guarded(access, std::move(handler))](
                             const httplib::Request& req, httplib::Response& res,
                             const httplib::ContentReader& read) {
    httplib::Request with_body = req;
    // Without Content-Length or Transfer-Encoding a request has no body (RFC 9112 6.3); httplib
    // would try to read one and fail.
    const bool has_body = req.has_header("Content-Length") || req.has_header("Transfer-Encoding");
    bool too_large = false;
    const bool whole = !has_body || read([&](const char* data, size_t n) {
      // httplib checks a Content-Length against the limit, but not a chunked body's size.
      if (with_body.body.size() + n > max_body) {
        too_large = true;
        return false;
      }
      with_body.body.append(data, n);
      return true;
    });
    if (!whole) {
      if (too_large || res.status == 413) {
        ReplyError(res, 413, DefaultMessage(req, 413, max_body));
      } else {
        ReplyError(res, 400, "the request body did not arrive whole");
      }
      return;
    }
    guarded(with_body, res);
  });
}

absl::StatusOr<int> HttpServer::Start() {
  std::string host;
  int port = 0;
  if (!SplitHostPort(options_.listen, &host, &port)) {
    return absl::UnavailableError(
        absl::StrCat(options_.listen_flag, "=", options_.listen, ": not HOST:PORT"));
  }
  if (tls_ != nullptr) {
    SSL_CTX* ctx = static_cast<httplib::SSLServer&>(*server_).ssl_context();
    if (ctx == nullptr) return absl::InternalError("TLS: httplib made no SSL context");
    if (absl::Status installed = tls_->Install(ctx); !installed.ok()) return installed;
  }
  if (host.empty()) host = "0.0.0.0";
  if (port == 0) {
    port = server_->bind_to_any_port(host);
  } else if (!server_->bind_to_port(host, port)) {
    port = -1;
  }
  if (port <= 0) {
    return absl::UnavailableError(absl::StrCat(options_.listen_flag, "=", options_.listen,
                                               ": cannot bind (in use, or not an address here)"));
  }
  port_ = port;
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  pthread_setname_np(thread_.native_handle(), "kiln-http-in");
  // httplib's stop() does nothing before its loop runs: wait for it, so Stop cannot miss it.
  for (int i = 0; i < 2000 && !server_->is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return port_;
}

void HttpServer::Stop() {
  if (!thread_.joinable()) return;
  server_->stop();
  thread_.join();
}

}  // namespace kiln::http
