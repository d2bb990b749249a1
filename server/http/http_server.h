// kilnd's HTTP listener: one port for Prometheus /metrics and the KServe v2 REST API, served by
// cpp-httplib (Debian's libcpp-httplib-dev, built with OpenSSL) on a pool of named threads,
// plaintext or TLS, with bearer tokens on the routes that ask for them and a body-size limit.
//
// Why cpp-httplib, not Boost.Beast: a blocking thread-per-connection server is all a scrape
// endpoint and a REST front end to a batched model need; httplib gives routing, keep-alive,
// chunked bodies, TLS and a client for tests in one packaged library, where Beast would have us
// write the connection state machines ourselves.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/http/request_origin.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace kiln::http {

class TlsHandshakeIdentity;

// The PEM text of the TLS set in force: the certificate chain (the server's own first), its
// key, and for mutual TLS the CA(s) client certificates must chain to (empty: no client
// certificate asked for).
struct HttpTlsPems {
  std::string cert_chain;
  std::string key;
  std::string client_ca;
};

struct HttpServerOptions {
  std::string listen;                            // HOST:PORT or [HOST]:PORT; port 0 picks one
  std::string listen_flag = "--metrics_listen";  // named in errors
  size_t max_body_bytes = 16 << 20;              // a larger request body is answered 413
  int threads = 16;                              // connections answered at once
  // TLS when set: asked at each handshake for the set in force, so renewed files reach new
  // connections without a restart. Null: plaintext.
  std::function<HttpTlsPems()> tls;
  // Bearer tokens when set: given a request's Authorization header values, OK or
  // Unauthenticated with the message to answer (401). Routes added with kToken call it.
  std::function<absl::Status(const std::vector<std::string_view>& authorization)> authorize;
  // Checked on every routed request (request_origin.h): cross-site requests always refused; the
  // Host header too when `authorize` is unset (without tokens, DNS rebinding could read).
  OriginPolicy origin;
  // Called once per answered request (also those httplib answers itself: no route, a body over
  // the limit) with its path, status and seconds from its head to the answer; thread-safe.
  std::function<void(const std::string& path, int status, double seconds)> on_request;
};

// Who may call a route: anyone, or (when HttpServerOptions::authorize is set) only a request
// with an accepted bearer token.
enum class Access { kOpen, kToken };

// Thread-safe once started. Handlers run on the pool's threads; an exception a handler lets
// out is answered 500 and goes no further.
class HttpServer {
 public:
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;

  explicit HttpServer(HttpServerOptions options);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Routes, before Start. `pattern` is a regular expression over the path (httplib's).
  void Get(const std::string& pattern, Access access, Handler handler);
  void Post(const std::string& pattern, Access access, Handler handler);

  // Binds and starts answering; returns the port bound. Unavailable naming the flag when the
  // address cannot be bound, InvalidArgument when the TLS PEMs do not load.
  absl::StatusOr<int> Start();
  // Stops accepting, lets the connections being answered finish, joins the threads; idempotent.
  void Stop();

  int port() const { return port_; }

 private:
  Handler Guarded(Access access, Handler handler) const;

  const HttpServerOptions options_;
  std::unique_ptr<TlsHandshakeIdentity> tls_;  // outlives server_'s connections
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

// Writes a JSON error body {"error": message} with `status`.
void ReplyError(httplib::Response& res, int status, std::string_view message);

}  // namespace kiln::http
