// A worker's Report stream to kilnd (worker.proto): reports go out from the training thread,
// commands come in on a reader thread of its own, which records them for rank 0 to pick up
// between steps and notices when the stream breaks. A watchdog cancels the call when a report
// cannot be written for a minute (kilnd alive on the network but not reading), so a worker
// never waits on kilnd for ever.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/worker/coordinator_connection.h"

namespace kiln::worker {

// The commands received so far; each is a flag kilnd may raise at any time.
struct ReceivedCommands {
  std::atomic<bool> checkpoint{false};  // taken (reset) by the one that acts on it
  std::atomic<bool> cancel{false};
  std::atomic<bool> stop{false};
};

class ReportStream {
 public:
  // Opens the stream and sends hello{rank, job_id, rank_token} (`rank_token`: what JoinJob
  // answered). The connection must outlive the stream.
  static absl::StatusOr<std::unique_ptr<ReportStream>> Open(CoordinatorConnection* connection,
                                                            const std::string& job_id, int rank,
                                                            const std::string& rank_token);
  // Cancels the call if Close did not end it, and joins the reader.
  ~ReportStream();
  ReportStream(const ReportStream&) = delete;
  ReportStream& operator=(const ReportStream&) = delete;

  // From now until Close, sends a keep-alive whenever no other report went out for `every`
  // (JoinJobResponse.keep_alive_interval_ms), so that kilnd hears from the worker while it
  // loads, meets its peers, or takes a long step. Call at most once.
  void StartKeepAlive(absl::Duration every);
  // Thread-safe. Unavailable once the stream is broken (kilnd went away or ended it).
  absl::Status Send(const v1::WorkerReport& report);
  // Sends done{} or failed{...} (`last`), half-closes and waits (at most `timeout`) for kilnd to
  // end the call; returns its final status. Call once, from the training thread.
  absl::Status Close(const v1::WorkerReport& last, absl::Duration timeout);

  ReceivedCommands& commands() { return commands_; }
  // Whether the stream ended while the worker still had things to say.
  bool broken() const { return broken_.load(); }
  // Why it broke, once broken() is true.
  std::string broken_reason() const;

 private:
  ReportStream(CoordinatorConnection* connection, std::unique_ptr<grpc::ClientContext> context)
      : connection_(connection), context_(std::move(context)) {}
  void ReadCommands();
  // Marks the stream broken for `reason`, unless it broke already.
  void SetBroken(const std::string& reason);
  // Runs `write` (a Write or WritesDone of stream_) under the watchdog's eye.
  bool Watched(const std::function<bool()>& write);
  void WatchWrites();
  void StopWatchdog();
  void SendKeepAlives(absl::Duration every);
  void StopKeepAlive();

  CoordinatorConnection* connection_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerReport, v1::WorkerCommand>> stream_;
  std::mutex write_mu_;  // one writer at a time; guards closed_ and last_sent_
  bool closed_ = false;
  absl::Time last_sent_ = absl::Now();
  ReceivedCommands commands_;
  std::atomic<bool> broken_{false};
  std::atomic<bool> reader_done_{false};
  mutable std::mutex reason_mu_;
  std::string broken_reason_;
  std::thread reader_;

  std::mutex watch_mu_;  // guards write_since_ and watch_stop_
  std::condition_variable watch_cv_;
  absl::Time write_since_ = absl::InfiniteFuture();  // when the write in flight began
  bool watch_stop_ = false;
  std::thread watchdog_;

  std::mutex keep_alive_mu_;  // guards keep_alive_stop_
  std::condition_variable keep_alive_cv_;
  bool keep_alive_stop_ = false;
  std::thread keep_alive_;
};

}  // namespace kiln::worker
