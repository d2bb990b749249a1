#include "server/http/http_server.h"

#include <httplib.h>
#include <netdb.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <exception>
#include <optional>
#include <regex>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/http/http_connection.h"
#include "server/http/http_listener.h"
#include "server/http/http_tls.h"

namespace kiln::http {

// httplib's request parser and router, driven over kiln's connections: process_request is
// httplib's own answer to one request on a stream (protected, for servers like this one).
class RoutingServer : public httplib::Server {
 public:
  bool Process(httplib::Stream& stream, bool close_connection, bool& connection_closed,
               const std::function<void(httplib::Request&)>& setup) {
    return process_request(stream, close_connection, connection_closed, setup);
  }
  // httplib's streamed answers (content providers) go on while this holds a socket: they end
  // at their next turn once it is stopping.
  void SetRunning(int listen_fd) { svr_sock_ = listen_fd; }
  void SetStopping() { svr_sock_ = INVALID_SOCKET; }
};

struct HttpServer::Route {
  std::regex pattern;
  bool get;  // GET (and HEAD), else POST
};

// Threads answering requests whose heads have arrived, from a bounded queue.
class RequestLane {
 public:
  using ServeFn = std::function<void(std::unique_ptr<Connection>)>;
  RequestLane(int threads, size_t max_queued, const char* name, ServeFn serve)
      : max_queued_(max_queued), serve_(std::move(serve)) {
    for (int i = 0; i < threads; ++i) {
      threads_.emplace_back([this] { Work(); });
      pthread_setname_np(threads_.back().native_handle(), name);
    }
  }
  ~RequestLane() { Join(); }

  // Queues `c` for a thread; false (and `c` left to the caller) when the queue is full or the
  // lane is stopping.
  bool TrySubmit(std::unique_ptr<Connection>& c) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_ || queue_.size() >= max_queued_ + idle_) return false;
      queue_.push_back(std::move(c));
    }
    cv_.notify_one();
    return true;
  }
  size_t queued() const {
    std::lock_guard<std::mutex> lock(mu_);
    return queue_.size();
  }
  // Takes no more; closes the connections queued and not started.
  void CloseQueued() {
    std::deque<std::unique_ptr<Connection>> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      dropped.swap(queue_);
    }
    cv_.notify_all();
  }
  // Waits for the threads, each once its request is answered.
  void Join() {
    CloseQueued();
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

 private:
  void Work() {
    for (;;) {
      std::unique_ptr<Connection> c;
      {
        std::unique_lock<std::mutex> lock(mu_);
        ++idle_;
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        --idle_;
        if (queue_.empty()) return;
        c = std::move(queue_.front());
        queue_.pop_front();
      }
      // Nothing leaves a request thread (handlers' exceptions are answered 500 already); what
      // else throws, an allocation, ends the connection.
      try {
        serve_(std::move(c));
      } catch (...) {
      }
    }
  }

  const size_t max_queued_;
  const ServeFn serve_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Connection>> queue_;  // guarded by mu_
  size_t idle_ = 0;                                // threads waiting; guarded by mu_
  bool stopping_ = false;                          // guarded by mu_
  std::vector<std::thread> threads_;
};

namespace {

constexpr int kKeepAliveRequests = 100;
// How long a request thread waits for a kept-alive client's next request before it hands the
// connection to the listener.
constexpr auto kNextRequestWait = std::chrono::milliseconds(10);

// The connection and stream of the request this thread is answering (set by Serve).
thread_local Connection* current_connection = nullptr;
thread_local ConnectionStream* current_stream = nullptr;
// When the request this thread is answering arrived (its head), for on_request.
thread_local std::optional<std::chrono::steady_clock::time_point> request_start;

Clock::duration ToClock(absl::Duration d) {
  return std::chrono::duration_cast<Clock::duration>(absl::ToChronoNanoseconds(d));
}

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

// A listening TCP socket on `host`:`port` (the first address it resolves to that binds),
// non-blocking; -1 when none binds.
int BindListener(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    // SO_REUSEADDR alone allows a quick restart; SO_REUSEPORT (httplib's default) would let a
    // second kilnd bind the same port and take half its connections.
    const int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (a->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  return fd;
}

int BoundPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return -1;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return -1;
}

// httplib compresses a text or JSON answer with brotli at its slowest quality (11) when a client
// accepts br: about 3 ms of CPU per KB of answer (80 ms for the page's script), so any client
// could make any answer cost seconds. Such a client gets gzip (or nothing) instead.
void GzipRatherThanBrotli(httplib::Request& req) {
  const std::string accepted = req.get_header_value("Accept-Encoding");
  if (accepted.find("br") == std::string::npos) return;
  req.headers.erase("Accept-Encoding");
  if (accepted.find("gzip") != std::string::npos) req.headers.emplace("Accept-Encoding", "gzip");
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

absl::Status CheckThreads(const HttpServerOptions& o) {
  if (o.threads < 1 || o.limits.probe_threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("the HTTP port needs threads: ", o.threads,
                                                   " and ", o.limits.probe_threads, " probe"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateHttpLimits(const HttpLimits& l) {
  for (const auto& [name, value] :
       {std::pair<const char*, int64_t>{"--http_max_connections", l.max_connections},
        {"--http_max_header_bytes", static_cast<int64_t>(l.max_header_bytes)},
        {"--http_max_headers", l.max_headers}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": must be at least 1, got ", value));
    }
  }
  for (const auto& [name, value] :
       {std::pair<const char*, absl::Duration>{"--http_header_timeout", l.header_timeout},
        {"--http_request_timeout", l.request_timeout},
        {"the HTTP port's idle timeout", l.idle_timeout},
        {"the HTTP port's I/O timeout", l.io_timeout}}) {
    if (value < absl::Milliseconds(1)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": must be at least 1ms, got ", absl::FormatDuration(value)));
    }
  }
  return absl::OkStatus();
}

void ReplyError(httplib::Response& res, int status, std::string_view message) {
  res.status = status;
  // Replaced, not thrown on: a message may echo bytes a client sent that are not UTF-8.
  res.set_content(nlohmann::json{{"error", std::string(message)}}.dump(
                      -1, ' ', false, nlohmann::json::error_handler_t::replace),
                  "application/json");
}

HttpServer::HttpServer(HttpServerOptions options)
    : options_(std::move(options)),
      meter_limits_{options_.limits.max_header_bytes, options_.limits.max_headers,
                    options_.max_body_bytes},
      server_(std::make_unique<RoutingServer>()) {
  if (options_.tls) tls_ = std::make_unique<TlsHandshakeIdentity>(options_.tls);
  // What httplib puts in its Keep-Alive header: the listener keeps these.
  server_->set_keep_alive_timeout(
      std::max<time_t>(1, absl::ToInt64Seconds(options_.limits.idle_timeout)));
  server_->set_keep_alive_max_count(kKeepAliveRequests);
  server_->set_payload_max_length(options_.max_body_bytes);
  const size_t max_body = options_.max_body_bytes;
  server_->set_error_handler(httplib::Server::HandlerWithResponse(
      [max_body](const httplib::Request& req, httplib::Response& res) {
        // Readiness answers "no" by status alone, with the empty body the protocol asks for.
        const bool readiness = absl::EndsWith(req.path, "/ready");
        if (!res.body.empty() || readiness) return httplib::Server::HandlerResponse::Unhandled;
        ReplyError(res, res.status, DefaultMessage(req, res.status, max_body));
        return httplib::Server::HandlerResponse::Handled;
      }));
  // Before any body is read: a request no route takes, or whose body cannot be taken, is
  // answered at once and its connection closed (post-routing handler), its body never read.
  server_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // A connection is answered on one thread, a request at a time: the start of the request
    // being answered is the thread's.
    if (options_.on_request) request_start = std::chrono::steady_clock::now();
    return Refuse(req, res) != 0 ? httplib::Server::HandlerResponse::Handled
                                 : httplib::Server::HandlerResponse::Unhandled;
  });
  // Expect: 100-continue asks before sending the body: a refusal is the answer instead.
  server_->set_expect_100_continue_handler(
      [this](const httplib::Request& req, httplib::Response& res) {
        const int refused = Refuse(req, res);
        return refused != 0 ? refused : 100;
      });
  server_->set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    // A request not read whole (a refused body, a broken one) leaves bytes that are no request:
    // the connection ends with this answer.
    const Connection* c = current_connection;
    const bool whole =
        c != nullptr && c->meter.has_value() && c->meter->state() == RequestMeter::State::kDone;
    if (!whole || stopping_) {
      res.headers.erase("Keep-Alive");
      if (res.get_header_value("Connection") != "close") {
        res.headers.erase("Connection");
        res.set_header("Connection", "close");
      }
    }
    if (req.method == "HEAD" && res.has_header("Accept-Ranges")) {
      res.headers.erase("Accept-Ranges");
      res.set_header("Accept-Ranges", "none");
    }
  });
  if (options_.on_request) {
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

HttpServer::~HttpServer() {
  Stop();
  // The lanes' threads are joined; what they serve is gone before the routes and the router.
  listener_.reset();
  general_lane_.reset();
  probe_lane_.reset();
  if (ssl_ctx_ != nullptr) SSL_CTX_free(ssl_ctx_);
}

std::function<void(const httplib::Request&, httplib::Response&)> HttpServer::Guarded(
    Access access, Handler handler) const {
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
    Caller caller = Caller::Unchecked();
    if (access == Access::kToken && options_.authorize) {
      std::vector<std::string_view> values;
      const auto [begin, end] = req.headers.equal_range("Authorization");
      for (auto it = begin; it != end; ++it) values.emplace_back(it->second);
      absl::StatusOr<Caller> allowed = options_.authorize(values);
      if (!allowed.ok()) {
        res.set_header("WWW-Authenticate", "Bearer");
        ReplyError(res, 401, std::string(allowed.status().message()));
        return;
      }
      caller = *std::move(allowed);
    }
    // No exception leaves a handler: one that escapes is this request's 500, not kilnd's end.
    try {
      handler(req, res, caller);
    } catch (const std::exception& e) {
      ReplyError(res, 500, absl::StrCat("internal error: ", e.what()));
    } catch (...) {
      ReplyError(res, 500, "internal error");
    }
  };
}

void HttpServer::Get(const std::string& pattern, Access access, Handler handler) {
  routes_.push_back({std::regex(pattern), true});
  server_->Get(pattern, Guarded(access, std::move(handler)));
}

void HttpServer::Post(const std::string& pattern, Access access, Handler handler) {
  routes_.push_back({std::regex(pattern), false});
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
      // The stream stops a chunked body at the limit; this is the same rule, kept as a guard.
      if (with_body.body.size() + n > max_body) {
        too_large = true;
        return false;
      }
      with_body.body.append(data, n);
      return true;
    });
    if (!whole) {
      const Connection* c = current_connection;
      if (too_large || res.status == 413 ||
          (c != nullptr && c->meter->state() == RequestMeter::State::kBodyTooLarge)) {
        ReplyError(res, 413, DefaultMessage(req, 413, max_body));
      } else if (current_stream != nullptr && current_stream->timed_out()) {
        ReplyError(res, 408,
                   "the request body did not arrive within --http_request_timeout of the "
                   "request's first byte");
      } else {
        ReplyError(res, 400, "the request body did not arrive whole");
      }
      return;
    }
    guarded(with_body, res);
  });
}

HttpServer::RouteMatch HttpServer::FindRoute(const std::string& method, const std::string& path,
                                             std::string* allow) const {
  const bool get = method == "GET" || method == "HEAD";
  bool path_routed = false, path_get = false, path_post = false;
  for (const Route& route : routes_) {
    if (!std::regex_match(path, route.pattern)) continue;
    if (get == route.get && (get || method == "POST")) return RouteMatch::kRouted;
    path_routed = true;
    (route.get ? path_get : path_post) = true;
  }
  if (!path_routed) return RouteMatch::kNone;
  *allow = path_get && path_post ? "GET, HEAD, POST" : path_get ? "GET, HEAD" : "POST";
  return RouteMatch::kOtherMethod;
}

int HttpServer::Refuse(const httplib::Request& req, httplib::Response& res) const {
  std::string allow;
  switch (FindRoute(req.method, req.path, &allow)) {
    case RouteMatch::kNone:
      ReplyError(res, 404, DefaultMessage(req, 404, options_.max_body_bytes));
      return 404;
    case RouteMatch::kOtherMethod:
      res.set_header("Allow", allow);
      ReplyError(res, 405, absl::StrCat(req.path, " takes ", allow, ", not ", req.method));
      return 405;
    case RouteMatch::kRouted:
      break;
  }
  const Connection* c = current_connection;
  if (c == nullptr || !c->meter.has_value()) return 0;
  switch (c->meter->state()) {
    case RequestMeter::State::kBadFraming:
      ReplyError(res, 400,
                 "the request body's length is not clear: Content-Length and Transfer-Encoding "
                 "together, a Transfer-Encoding other than chunked, or a Content-Length that "
                 "is not one number");
      return 400;
    case RequestMeter::State::kBodyTooLarge:
      ReplyError(res, 413, DefaultMessage(req, 413, options_.max_body_bytes));
      return 413;
    default:
      return 0;
  }
}

int HttpServer::open_connections() const {
  return listener_ == nullptr ? 0 : listener_->open_connections();
}

void HttpServer::Dispatch(std::unique_ptr<Connection> c) {
  const RequestMeter& m = *c->meter;
  const bool probe = IsProbe(m);
  RequestLane& lane = probe ? *probe_lane_ : *general_lane_;
  if (lane.TrySubmit(c)) return;
  // Shed, not queued without end: the client is told to come back.
  c->WriteWithoutWaiting(ClosingAnswer(503,
                                       absl::StrCat("kilnd's HTTP port is busy: ", lane.queued(),
                                                    " requests wait for its threads; try again"),
                                       "Retry-After: 1\r\n"));
  if (options_.on_request) options_.on_request(m.path(), 503, 0.0);
}

bool HttpServer::IsProbe(const RequestMeter& m) const {
  return (m.method() == "GET" || m.method() == "HEAD") && m.state() == RequestMeter::State::kDone &&
         std::find(options_.probe_paths.begin(), options_.probe_paths.end(), m.path()) !=
             options_.probe_paths.end();
}

HttpServer::After HttpServer::AnswerOne(Connection& c, bool probe) {
  const HttpLimits& limits = options_.limits;
  ConnectionStream::Timeouts timeouts{c.request_start + ToClock(limits.request_timeout),
                                      ToClock(limits.io_timeout), std::nullopt};
  // A probe's answer is small: written whole within the I/O timeout, or the client is dropped,
  // so that clients that do not read cannot keep the probe lane.
  if (probe) timeouts.answer_timeout = ToClock(limits.io_timeout);
  timeouts.write_wait_grace = ToClock(limits.write_wait_grace);
  timeouts.min_read_rate = limits.min_read_rate;
  ConnectionStream stream(c, timeouts);
  current_connection = &c;
  current_stream = &stream;
  const bool last = c.requests + 1 >= kKeepAliveRequests;
  bool closed = false;
  bool answered = false;
  SSL* ssl = c.ssl();
  try {
    answered = server_->Process(stream, last, closed, [ssl](httplib::Request& req) {
      // Ranges are not served: a multi-range answer is built whole in memory by httplib.
      req.ranges.clear();
      req.ssl = ssl;
      GzipRatherThanBrotli(req);
    });
  } catch (...) {
    answered = false;  // nothing leaves a request thread; the connection just ends
  }
  current_connection = nullptr;
  current_stream = nullptr;
  request_start.reset();
  ++c.requests;
  const bool whole = c.meter->state() == RequestMeter::State::kDone;
  const bool written = answered && !stream.write_failed();
  c.set_clean_close(written);
  if (stream.write_failed()) c.ResetOnClose();
  if (written && whole && !closed && !last) {
    c.meter.reset();  // the next request's starts when its first byte comes
    return After::kNext;
  }
  // Answered without its body read: the client may still be sending it.
  if (written && !whole) return After::kLinger;
  return After::kClose;
}

HttpServer::NextHead HttpServer::AwaitNextHead(Connection& c) {
  c.meter.reset();
  const Clock::time_point deadline = Clock::now() + kNextRequestWait;
  size_t fed = 0;
  // Nothing pipelined: wait before the first read rather than after a read that finds nothing.
  if (c.unconsumed() == 0 && (c.ssl() == nullptr || SSL_pending(c.ssl()) == 0) &&
      !c.Wait(POLLIN, deadline)) {
    return NextHead::kNone;
  }
  for (;;) {
    if (c.unconsumed() > fed) {
      if (!c.meter.has_value()) {
        c.meter.emplace(meter_limits_);
        c.request_start = Clock::now();
      }
      fed += c.meter->TakeHead(c.input().data() + c.consumed() + fed, c.unconsumed() - fed);
      if (c.meter->state() == RequestMeter::State::kHeadTooLarge ||
          c.meter->state() == RequestMeter::State::kTooManyHeaders) {
        return NextHead::kPartial;  // the listener answers it
      }
      if (c.meter->state() != RequestMeter::State::kHead) {
        c.head_left = c.meter->head_bytes();
        return NextHead::kWhole;
      }
    }
    const Connection::Io io = c.ReadSome(16 << 10);
    if (io == Connection::Io::kDone) continue;
    if (io != Connection::Io::kWantRead && io != Connection::Io::kWantWrite) {
      return NextHead::kClosed;
    }
    if (!c.Wait(io == Connection::Io::kWantRead ? POLLIN : POLLOUT, deadline)) {
      return c.meter.has_value() ? NextHead::kPartial : NextHead::kNone;
    }
  }
}

void HttpServer::Serve(std::unique_ptr<Connection> c, bool probe) {
  {
    std::lock_guard<std::mutex> lock(active_mu_);
    if (stopping_) return;  // closed unanswered, as Stop closes the queued ones
    active_.push_back(c.get());
  }
  RequestLane& lane = probe ? *probe_lane_ : *general_lane_;
  After after = After::kClose;
  for (;;) {
    after = AnswerOne(*c, probe);
    if (after != After::kNext) break;
    // A kept-alive client usually sends its next request at once: waited for here a moment,
    // it is answered without two hand-offs between threads. A head that does not come whole in
    // that moment is waited for by the listener, and so are all when others wait for a thread.
    if (stopping_ || lane.queued() > 0) break;
    const NextHead next = AwaitNextHead(*c);
    if (next == NextHead::kClosed) {
      after = After::kClose;
      break;
    }
    if (next != NextHead::kWhole) break;
    if (IsProbe(*c->meter) != probe) {
      after = After::kDispatch;
      break;
    }
  }
  {
    std::lock_guard<std::mutex> lock(active_mu_);
    active_.erase(std::find(active_.begin(), active_.end(), c.get()));
    if (stopping_) {
      active_cv_.notify_all();
      c.reset();  // closed under the lock: Stop may be cutting the connections listed
      return;
    }
  }
  switch (after) {
    case After::kNext:
      listener_->Return(std::move(c));
      break;
    case After::kLinger:
      listener_->Return(std::move(c), /*linger=*/true);
      break;
    case After::kDispatch:
      Dispatch(std::move(c));
      break;
    case After::kClose:
      break;  // closed as `c` goes
  }
}

absl::StatusOr<int> HttpServer::Start() {
  std::string host;
  int port = 0;
  if (!SplitHostPort(options_.listen, &host, &port)) {
    return absl::UnavailableError(
        absl::StrCat(options_.listen_flag, "=", options_.listen, ": not HOST:PORT"));
  }
  if (absl::Status valid = ValidateHttpLimits(options_.limits); !valid.ok()) return valid;
  if (absl::Status valid = CheckThreads(options_); !valid.ok()) return valid;
  if (tls_ != nullptr) {
    ssl_ctx_ = SSL_CTX_new(TLS_method());
    if (ssl_ctx_ == nullptr) return absl::InternalError("TLS: OpenSSL made no context");
    // Writes may be partial and resumed: the connection's socket is non-blocking.
    SSL_CTX_set_mode(ssl_ctx_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (absl::Status installed = tls_->Install(ssl_ctx_); !installed.ok()) return installed;
  }
  if (host.empty()) host = "0.0.0.0";
  const int listen_fd = BindListener(host, port);
  if (listen_fd < 0) {
    return absl::UnavailableError(absl::StrCat(options_.listen_flag, "=", options_.listen,
                                               ": cannot bind (in use, or not an address here)"));
  }
  port_ = BoundPort(listen_fd);
  server_->SetRunning(listen_fd);
  const HttpLimits& limits = options_.limits;
  general_lane_ = std::make_unique<RequestLane>(
      options_.threads, static_cast<size_t>(std::max(0, limits.max_queued_requests)), "kiln-http",
      [this](std::unique_ptr<Connection> c) { Serve(std::move(c), false); });
  probe_lane_ = std::make_unique<RequestLane>(
      limits.probe_threads, 4 * static_cast<size_t>(limits.probe_threads), "kiln-http-probe",
      [this](std::unique_ptr<Connection> c) { Serve(std::move(c), true); });
  HttpListener::Options listener;
  listener.limits = {limits.max_connections, limits.reserved_descriptors};
  listener.request = meter_limits_;
  listener.idle_timeout = ToClock(limits.idle_timeout);
  listener.header_timeout = ToClock(limits.header_timeout);
  listener.tls = ssl_ctx_;
  listener_ = std::make_unique<HttpListener>(
      listener, [this](std::unique_ptr<Connection> c) { Dispatch(std::move(c)); },
      [on_request = options_.on_request](const std::string& path, int status) {
        if (on_request) on_request(path, status, 0.0);
      },
      options_.on_connection_refused);
  listener_->Start(listen_fd);
  return port_;
}

void HttpServer::Stop() {
  if (stopped_ || listener_ == nullptr) return;
  stopped_ = true;
  stopping_ = true;
  server_->SetStopping();
  // No new requests: nothing is dispatched once the listener has stopped.
  listener_->Stop();
  general_lane_->CloseQueued();
  probe_lane_->CloseQueued();
  std::unique_lock<std::mutex> lock(active_mu_);
  active_cv_.wait_for(lock, absl::ToChronoNanoseconds(options_.limits.stop_grace),
                      [this] { return active_.empty(); });
  // Past the grace, whatever the clients do: their reads and writes fail at once, and each
  // thread is free when its handler returns.
  for (Connection* c : active_) c->Shutdown();
  lock.unlock();
  general_lane_->Join();
  probe_lane_->Join();
}

}  // namespace kiln::http
