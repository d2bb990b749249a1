// kilnd's HTTP listener: one port for Prometheus /metrics, the KServe v2 REST API and the web
// page, answered by cpp-httplib's request parser and router (Debian's libcpp-httplib-dev, built
// with OpenSSL), plaintext or TLS, with bearer tokens on the routes that ask for them.
//
// Every request is bounded before its body is read, routed or not, and no client can hold a
// thread by being slow: the connections are kiln's own (http_listener.h: accept, TLS handshake,
// the wait for a request's whole head, all on one thread with epoll, within the connection cap
// and descriptor reserve every listener keeps), and httplib only parses and routes a request
// whose head has arrived whole, reading its body through a metered stream (http_connection.h)
// with a whole-request deadline. Requests run on two lanes of threads: a small one for the
// probes (/metrics and the health routes), which slow or waiting requests on the other lane
// cannot take, and the general one, whose queue is bounded (503 past it). An unrouted method or
// path, a body over the limit or framed two ways is answered without reading the body, and the
// connection closed; Range headers are ignored (kiln serves no partial content).
//
// Why cpp-httplib, not Boost.Beast: httplib gives routing, request parsing, chunked bodies and a
// client for tests in one packaged library; what 0.11 lacks (limits on headers and on unrouted
// bodies, deadlines, a bounded accept queue) is this listener around its protected
// process_request, so every handler keeps httplib's Request and Response.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/access/caller.h"
#include "server/http/request_meter.h"
#include "server/http/request_origin.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

typedef struct ssl_ctx_st SSL_CTX;

namespace kiln::http {

using server::Caller;

class TlsHandshakeIdentity;
class HttpListener;
class RequestLane;
class RoutingServer;
class Connection;

// The PEM text of the TLS set in force: the certificate chain (the server's own first), its
// key, and for mutual TLS the CA(s) client certificates must chain to (empty: no client
// certificate asked for).
struct HttpTlsPems {
  std::string cert_chain;
  std::string key;
  std::string client_ca;
};

// What a client of the port can take, whatever it does (docs/limits.md); kilnd's flags in
// brackets.
struct HttpLimits {
  int max_connections = 512;           // open at once [--http_max_connections]
  int reserved_descriptors = 64;       // below the open-file limit, never for connections
                                       // [--reserved_descriptors, as the gRPC port]
  size_t max_header_bytes = 64 << 10;  // a request's line and headers [--http_max_header_bytes]
  int max_headers = 100;               // header fields of a request [--http_max_headers]
  // A request's head (and a TLS handshake) must arrive within this of its first byte
  // [--http_header_timeout]; its head and body within request_timeout [--http_request_timeout].
  absl::Duration header_timeout = absl::Seconds(10);
  absl::Duration request_timeout = absl::Seconds(60);
  absl::Duration idle_timeout = absl::Seconds(5);  // a connection between requests
  absl::Duration io_timeout = absl::Seconds(5);    // each read and write must progress within it
  // An answer's writes may wait on its client this long in all, plus one second per
  // min_read_rate bytes written; past it the client is cut (a trickling or stalled reader).
  absl::Duration write_wait_grace = absl::Seconds(10);
  int64_t min_read_rate = 64 << 10;  // bytes per second
  int probe_threads = 2;             // the lane of the probe paths, apart from `threads`
  int max_queued_requests = 64;      // whole heads waiting for a general thread; more are 503
  absl::Duration stop_grace = absl::Seconds(2);  // Stop() lets requests being answered finish
};

struct HttpServerOptions {
  std::string listen;                            // HOST:PORT or [HOST]:PORT; port 0 picks one
  std::string listen_flag = "--metrics_listen";  // named in errors
  size_t max_body_bytes = 16 << 20;              // a larger request body is answered 413
  int threads = 16;                              // requests answered at once (general lane)
  HttpLimits limits;
  // GET/HEAD requests without a body to these paths run on the probe lane.
  std::vector<std::string> probe_paths = {"/metrics", "/v2/health/live", "/v2/health/ready"};
  // TLS when set: asked at each handshake for the set in force, so renewed files reach new
  // connections without a restart. Null: plaintext.
  std::function<HttpTlsPems()> tls;
  // Bearer tokens when set: given a request's Authorization header values, who the token names,
  // or Unauthenticated with the message to answer (401). Routes added with kToken call it, and
  // their handlers get its caller; without it (and on kOpen routes) Caller::Unchecked().
  std::function<absl::StatusOr<Caller>(const std::vector<std::string_view>& authorization)>
      authorize;
  // Checked on every routed request (request_origin.h): cross-site requests always refused; the
  // Host header too when `authorize` is unset (without tokens, DNS rebinding could read).
  OriginPolicy origin;
  // Called once per answered request (also those httplib answers itself: no route, a body over
  // the limit, and those the listener answers: 408, 431, 503) with its path, status and seconds
  // from its head to the answer; thread-safe.
  std::function<void(const std::string& path, int status, double seconds)> on_request;
  // Called for each connection closed on accept ("max_connections" or "descriptors"), on the
  // listener's thread; must not block.
  std::function<void(const char* reason)> on_connection_refused;
};

// Who may call a route: anyone, or (when HttpServerOptions::authorize is set) only a request
// with an accepted bearer token.
enum class Access { kOpen, kToken };

// Thread-safe once started. Handlers run on the lanes' threads; an exception a handler lets
// out is answered 500 and goes no further.
class HttpServer {
 public:
  using Handler =
      std::function<void(const httplib::Request&, httplib::Response&, const Caller& caller)>;

  explicit HttpServer(HttpServerOptions options);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Routes, before Start. `pattern` is a regular expression over the path (httplib's).
  void Get(const std::string& pattern, Access access, Handler handler);
  void Post(const std::string& pattern, Access access, Handler handler);

  // Binds and starts answering; returns the port bound. Unavailable naming the flag when the
  // address cannot be bound, InvalidArgument when the TLS PEMs do not load or a limit is not
  // positive.
  absl::StatusOr<int> Start();
  // Stops accepting and closes idle and queued connections; lets the requests being answered
  // finish for up to limits.stop_grace, then cuts their connections, and joins the threads once
  // their handlers return. Idempotent.
  void Stop();

  int port() const { return port_; }
  // Connections open on the port now (waiting, queued or being answered).
  int open_connections() const;

 private:
  struct Route;
  enum class RouteMatch { kRouted, kOtherMethod, kNone };

  // httplib's handler for a route: the origin and token checks, then `handler` with the caller.
  std::function<void(const httplib::Request&, httplib::Response&)> Guarded(Access access,
                                                                           Handler handler) const;
  // Whether a route takes `method` on `path`; `allow` gets the methods that would.
  RouteMatch FindRoute(const std::string& method, const std::string& path,
                       std::string* allow) const;
  // Refuses, before its body is read, a request no route takes or whose body cannot be taken:
  // fills `res` and returns its status, or 0 to let it through.
  int Refuse(const httplib::Request& req, httplib::Response& res) const;
  // What becomes of a connection after a request: the next one (kept alive), a linger on its
  // unread body, the other lane (its next request is for it), or the end.
  enum class After { kNext, kLinger, kDispatch, kClose };
  enum class NextHead { kWhole, kPartial, kNone, kClosed };
  // Whether a request whose head is `meter`'s runs on the probe lane.
  bool IsProbe(const RequestMeter& meter) const;
  // Hands a connection whose request head is whole to its lane (503 when the lane is full).
  void Dispatch(std::unique_ptr<Connection> connection);
  // Answers the connection's requests on this lane thread while they come at once.
  void Serve(std::unique_ptr<Connection> connection, bool probe);
  After AnswerOne(Connection& connection, bool probe);
  // Waits a moment for the next request's whole head, metering what comes.
  NextHead AwaitNextHead(Connection& connection);

  const HttpServerOptions options_;
  const RequestMeter::Limits meter_limits_;
  std::vector<Route> routes_;
  std::unique_ptr<TlsHandshakeIdentity> tls_;  // outlives every connection
  SSL_CTX* ssl_ctx_ = nullptr;
  std::unique_ptr<RoutingServer> server_;
  std::unique_ptr<RequestLane> general_lane_, probe_lane_;
  std::unique_ptr<HttpListener> listener_;
  std::atomic<bool> stopping_{false};
  bool stopped_ = false;
  int port_ = 0;

  // Connections being answered, so that Stop can cut them.
  mutable std::mutex active_mu_;
  std::condition_variable active_cv_;
  std::vector<Connection*> active_;  // guarded by active_mu_
};

// OK, or InvalidArgument naming the flag of the first limit that lets nothing through (a count
// below 1, a timeout below 1 ms).
absl::Status ValidateHttpLimits(const HttpLimits& limits);

// Writes a JSON error body {"error": message} with `status`.
void ReplyError(httplib::Response& res, int status, std::string_view message);

}  // namespace kiln::http
