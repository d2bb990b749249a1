#include "server/http/http_listener.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kiln::http {
namespace {

constexpr size_t kReadChunk = 16 << 10;
// How often deadlines are checked: they are seconds long, so this is their precision.
constexpr auto kSweepInterval = std::chrono::milliseconds(50);
// After a failed attempt to drain a connection for want of descriptors, accepting waits this.
constexpr auto kAcceptPause = std::chrono::milliseconds(100);
// A connection answered without its request read whole is read and dropped for this long, or
// this many bytes, before it is closed (nginx's lingering close).
constexpr auto kLingerTime = std::chrono::seconds(2);
constexpr size_t kLingerBytes = 1 << 20;

char listen_tag, wake_tag;

}  // namespace

struct HttpListener::Waiting {
  std::unique_ptr<Connection> c;
  enum class Phase { kHandshake, kIdle, kHead, kLinger } phase = Phase::kIdle;
  Clock::time_point since;     // entered this phase
  Clock::time_point deadline;  // closed when it has not moved on by then
  size_t fed = 0;              // unconsumed input the meter has seen
  size_t dropped = 0;          // kLinger: bytes read and dropped
  bool want_write = false;     // watched for POLLOUT rather than POLLIN
};

HttpListener::HttpListener(Options options, DispatchFn dispatch, AnsweredFn answered,
                           RefusedFn refused)
    : options_(std::move(options)),
      dispatch_(std::move(dispatch)),
      answered_(std::move(answered)),
      refused_(std::move(refused)) {}

HttpListener::~HttpListener() {
  Stop();
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void HttpListener::Start(int listen_fd) {
  listen_fd_ = listen_fd;
  descriptor_limit_ = OpenFileLimit();
  KeepSpareDescriptor();
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = &listen_tag;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.ptr = &wake_tag;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  thread_ = std::thread([this] { Run(); });
  pthread_setname_np(thread_.native_handle(), "kiln-http-in");
}

void HttpListener::Stop() {
  {
    std::lock_guard<std::mutex> lock(returned_mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  stopping_ = true;
  if (!thread_.joinable()) return;
  Wake();
  thread_.join();
}

void HttpListener::Wake() {
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) < 0) {
    // The counter is far from full; a wake that failed is still seen at the next sweep.
  }
}

void HttpListener::Return(std::unique_ptr<Connection> connection, bool linger) {
  std::lock_guard<std::mutex> lock(returned_mu_);
  if (stopped_) return;  // closed as `connection` goes
  returned_.emplace_back(std::move(connection), linger);
  Wake();
}

void HttpListener::Run() {
  std::vector<epoll_event> events(256);
  Clock::time_point last_sweep = Clock::now();
  while (!stopping_) {
    const bool timed = !waiting_.empty() || accept_paused_until_ != Clock::time_point{};
    const int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()),
                             timed ? static_cast<int>(kSweepInterval.count()) : -1);
    Clock::time_point now = Clock::now();
    for (int i = 0; i < n && !stopping_; ++i) {
      void* tag = events[i].data.ptr;
      // Nothing thrown (an allocation that fails) may end the listener: the connection it came
      // from is closed instead.
      try {
        if (tag == &listen_tag) {
          AcceptAll(now);
        } else if (tag == &wake_tag) {
          uint64_t count;
          while (read(wake_fd_, &count, sizeof(count)) > 0) {
          }
          TakeReturned(now);
        } else {
          // An event of a connection closed earlier in this round finds nothing.
          auto it = waiting_.find(static_cast<Connection*>(tag));
          if (it != waiting_.end()) Advance(*it->second, now);
        }
      } catch (...) {
        if (tag != &listen_tag && tag != &wake_tag) Close(static_cast<Connection*>(tag));
      }
    }
    now = Clock::now();
    if (now - last_sweep >= kSweepInterval) {
      try {
        Sweep(now);
      } catch (...) {
        // Tried again at the next sweep.
      }
      last_sweep = now;
    }
  }
  waiting_.clear();  // closes them
  {
    std::lock_guard<std::mutex> lock(returned_mu_);
    returned_.clear();
  }
  close(listen_fd_);  // the epoll and wake descriptors go with the listener
}

void HttpListener::AcceptAll(Clock::time_point now) {
  // At most this many a round, so that a flood of connections does not keep the waiting ones
  // from their turn (the listening socket, still readable, comes up again at once).
  for (int round = 0; round < 256; ++round) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) {
        // Out of descriptors: the pending connection is taken off the queue and closed, so that
        // the backlog does not fill with connections nobody will answer.
        if (DrainPendingConnection(listen_fd_, &accept4)) {
          if (refused_) refused_("descriptors");
          continue;
        }
        accept_paused_until_ = now + kAcceptPause;
        epoll_event ev{};
        ev.data.ptr = &listen_tag;
        epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
      }
      return;  // EAGAIN: all taken
    }
    const char* refusal = RefuseConnection(fd, open_->load(), descriptor_limit_, options_.limits);
    // At the cap (not in the reserve), the connection waiting longest makes room.
    if (refusal != nullptr && open_->load() >= ConnectionCap(descriptor_limit_, options_.limits) &&
        Evict()) {
      refusal = RefuseConnection(fd, open_->load(), descriptor_limit_, options_.limits);
    }
    if (refusal != nullptr) {
      close(fd);
      if (refused_) refused_(refusal);
      continue;
    }
    // Answers go out whole, not behind Nagle's wait for the client's delayed ACK.
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    SSL* ssl = nullptr;
    if (options_.tls != nullptr) {
      ssl = SSL_new(options_.tls);
      if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
        if (ssl != nullptr) SSL_free(ssl);
        close(fd);
        continue;
      }
    }
    auto w = std::make_unique<Waiting>();
    w->c = std::make_unique<Connection>(fd, ssl, open_);
    w->since = now;
    if (ssl != nullptr) {
      w->phase = Waiting::Phase::kHandshake;
      w->deadline = now + options_.header_timeout;
    } else {
      w->phase = Waiting::Phase::kIdle;
      w->deadline = now + options_.idle_timeout;
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = w->c.get();
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    Connection* key = w->c.get();
    waiting_.emplace(key, std::move(w));
  }
}

bool HttpListener::Evict() {
  Waiting* oldest = nullptr;
  for (auto& [key, w] : waiting_) {
    // Idle and lingering connections go first: they have no request under way.
    const bool idle = w->phase == Waiting::Phase::kIdle || w->phase == Waiting::Phase::kLinger;
    const bool oldest_idle = oldest != nullptr && (oldest->phase == Waiting::Phase::kIdle ||
                                                   oldest->phase == Waiting::Phase::kLinger);
    if (oldest == nullptr || (idle && !oldest_idle) ||
        (idle == oldest_idle && w->since < oldest->since)) {
      oldest = w.get();
    }
  }
  if (oldest == nullptr) return false;
  Close(oldest->c.get());
  return true;
}

bool HttpListener::Advance(Waiting& w, Clock::time_point now) {
  Connection& c = *w.c;
  if (w.phase == Waiting::Phase::kLinger) {
    for (;;) {
      w.dropped += c.unconsumed();
      c.Consume(c.unconsumed());
      if (w.dropped > kLingerBytes) break;
      const Connection::Io io = c.ReadSome(kReadChunk);
      if (io == Connection::Io::kDone) continue;
      if (io != Connection::Io::kWantRead && io != Connection::Io::kWantWrite) break;
      Watch(w, io == Connection::Io::kWantWrite);
      return true;
    }
    Close(&c);
    return false;
  }
  if (w.phase == Waiting::Phase::kHandshake) {
    const Connection::Io io = c.Handshake();
    if (io == Connection::Io::kWantRead || io == Connection::Io::kWantWrite) {
      Watch(w, io == Connection::Io::kWantWrite);
      return true;
    }
    if (io != Connection::Io::kDone) {
      Close(&c);
      return false;
    }
    w.phase = Waiting::Phase::kIdle;
    w.since = now;
    w.deadline = now + options_.idle_timeout;
  }
  for (;;) {
    if (c.unconsumed() > w.fed) {
      if (!c.meter.has_value()) {
        c.meter.emplace(options_.request);
        c.request_start = now;
        w.phase = Waiting::Phase::kHead;
        w.since = now;
        w.deadline = now + options_.header_timeout;
      }
      const char* next = c.input().data() + c.consumed() + w.fed;
      w.fed += c.meter->TakeHead(next, c.unconsumed() - w.fed);
    }
    if (c.meter.has_value()) {
      switch (c.meter->state()) {
        case RequestMeter::State::kHead:
          break;
        case RequestMeter::State::kHeadTooLarge:
          AnswerAndLinger(
              w, 431,
              absl::StrCat("the request head is over the limit of ",
                           options_.request.max_head_bytes, " bytes (--http_max_header_bytes)"));
          return Advance(w, now);
        case RequestMeter::State::kTooManyHeaders:
          AnswerAndLinger(w, 431,
                          absl::StrCat("the request has more than ", options_.request.max_headers,
                                       " header fields (--http_max_headers)"));
          return Advance(w, now);
        default: {
          // The head is whole: on to a request thread, which answers what else is wrong.
          c.head_left = c.meter->head_bytes();
          dispatch_(Release(&c));
          return false;
        }
      }
    }
    const Connection::Io io = c.ReadSome(kReadChunk);
    if (io == Connection::Io::kDone) continue;
    if (io == Connection::Io::kWantRead || io == Connection::Io::kWantWrite) {
      Watch(w, io == Connection::Io::kWantWrite);
      return true;
    }
    Close(&c);  // the client has gone (or broke TLS)
    return false;
  }
}

void HttpListener::Watch(Waiting& w, bool want_write) {
  if (w.want_write == want_write) return;
  w.want_write = want_write;
  epoll_event ev{};
  ev.events = want_write ? EPOLLOUT : EPOLLIN;
  ev.data.ptr = w.c.get();
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, w.c->fd(), &ev);
}

std::unique_ptr<Connection> HttpListener::Release(Connection* key) {
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return nullptr;
  std::unique_ptr<Connection> c = std::move(it->second->c);
  waiting_.erase(it);
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd(), nullptr);
  return c;
}

void HttpListener::Close(Connection* key) { Release(key).reset(); }

void HttpListener::AnswerAndLinger(Waiting& w, int status, const std::string& message) {
  Connection& c = *w.c;
  c.WriteWithoutWaiting(ClosingAnswer(status, message));
  if (answered_) answered_(c.meter.has_value() ? c.meter->path() : "", status);
  Linger(w, Clock::now());
}

void HttpListener::Linger(Waiting& w, Clock::time_point now) {
  w.c->ShutdownWrites();
  w.phase = Waiting::Phase::kLinger;
  w.since = now;
  w.deadline = now + kLingerTime;
  w.dropped = 0;
  Watch(w, false);
}

void HttpListener::Place(std::unique_ptr<Connection> c, bool linger, Clock::time_point now) {
  auto w = std::make_unique<Waiting>();
  if (c->meter.has_value() && !linger) {
    // Part of the next head came while a request thread waited for it: it goes on from there.
    w->phase = Waiting::Phase::kHead;
    w->since = c->request_start;
    w->deadline = c->request_start + options_.header_timeout;
    w->fed = c->unconsumed();
  } else {
    c->meter.reset();
    w->phase = Waiting::Phase::kIdle;
    w->since = now;
    w->deadline = now + options_.idle_timeout;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = c.get();
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c->fd(), &ev);
  Connection* key = c.get();
  w->c = std::move(c);
  Waiting& placed = *waiting_.emplace(key, std::move(w)).first->second;
  if (linger) Linger(placed, now);
  // A pipelined request may be here already (in the input, or inside TLS's buffer).
  Advance(placed, now);
}

void HttpListener::TakeReturned(Clock::time_point now) {
  std::vector<std::pair<std::unique_ptr<Connection>, bool>> back;
  {
    std::lock_guard<std::mutex> lock(returned_mu_);
    back.swap(returned_);
  }
  for (auto& [c, linger] : back) Place(std::move(c), linger, now);
}

void HttpListener::Sweep(Clock::time_point now) {
  if (accept_paused_until_ != Clock::time_point{} && now >= accept_paused_until_) {
    accept_paused_until_ = {};
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = &listen_tag;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
  }
  std::vector<Connection*> late;
  for (auto& [key, w] : waiting_) {
    if (now >= w->deadline) late.push_back(key);
  }
  // Closed without an answer, as nginx does at its header timeout: a client that sent part of a
  // request in that time is not waiting for one.
  for (Connection* key : late) Close(key);
}

}  // namespace kiln::http
