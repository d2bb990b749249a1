#include "server/worker/report_stream.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kiln::worker {
namespace {

// How long one report may wait to be written before the stream counts as broken.
constexpr absl::Duration kWriteTimeout = absl::Minutes(1);

}  // namespace

absl::StatusOr<std::unique_ptr<ReportStream>> ReportStream::Open(CoordinatorConnection* connection,
                                                                 const std::string& job_id,
                                                                 int rank,
                                                                 const std::string& rank_token) {
  // The stream lasts the whole training run, so no deadline: keepalives (the connection's) and
  // kilnd ending the call are what end a dead one.
  std::unique_ptr<ReportStream> stream(
      new ReportStream(connection, connection->NewContext(absl::InfiniteDuration())));
  stream->stream_ = connection->stub().Report(stream->context_.get());
  v1::WorkerReport hello;
  hello.mutable_hello()->set_rank(rank);
  hello.mutable_hello()->set_job_id(job_id);
  hello.mutable_hello()->set_rank_token(rank_token);
  if (!stream->stream_->Write(hello)) {
    stream->closed_ = true;
    grpc::Status status = stream->stream_->Finish();
    stream->stream_.reset();
    return FromGrpc(
        status.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream closed") : status,
        "opening the Report stream");
  }
  stream->reader_ = std::thread([s = stream.get()] { s->ReadCommands(); });
  stream->watchdog_ = std::thread([s = stream.get()] { s->WatchWrites(); });
  return stream;
}

ReportStream::~ReportStream() {
  StopKeepAlive();
  StopWatchdog();
  if (reader_.joinable()) {
    context_->TryCancel();
    reader_.join();
    stream_->Finish().IgnoreError();
  }
}

void ReportStream::SetBroken(const std::string& reason) {
  std::lock_guard<std::mutex> lock(reason_mu_);
  if (broken_.load()) return;
  broken_reason_ = reason;
  broken_.store(true);
}

bool ReportStream::Watched(const std::function<bool()>& write) {
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    write_since_ = absl::Now();
  }
  const bool written = write();
  std::lock_guard<std::mutex> lock(watch_mu_);
  write_since_ = absl::InfiniteFuture();
  return written;
}

void ReportStream::WatchWrites() {
  std::unique_lock<std::mutex> lock(watch_mu_);
  while (!watch_stop_) {
    if (absl::Now() - write_since_ > kWriteTimeout) {
      SetBroken(absl::StrCat("kilnd took no report for ", absl::FormatDuration(kWriteTimeout)));
      context_->TryCancel();  // the blocked Write returns false
      return;
    }
    watch_cv_.wait_for(lock, std::chrono::seconds(1));
  }
}

void ReportStream::StopWatchdog() {
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    watch_stop_ = true;
  }
  watch_cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

void ReportStream::StartKeepAlive(absl::Duration every) {
  if (every <= absl::ZeroDuration() || keep_alive_.joinable()) return;
  keep_alive_ = std::thread([this, every] { SendKeepAlives(every); });
}

void ReportStream::SendKeepAlives(absl::Duration every) {
  v1::WorkerReport keep_alive;
  keep_alive.mutable_keep_alive();
  std::unique_lock<std::mutex> lock(keep_alive_mu_);
  while (!keep_alive_cv_.wait_for(lock, absl::ToChronoMilliseconds(every / 2),
                                  [&] { return keep_alive_stop_; })) {
    {
      std::lock_guard<std::mutex> write_lock(write_mu_);
      if (closed_ || broken_.load()) return;
      if (absl::Now() - last_sent_ < every) continue;
    }
    // A failed send breaks the stream; the training thread hears of it at its next report.
    lock.unlock();  // StopKeepAlive must not wait behind a slow write
    Send(keep_alive).IgnoreError();
    lock.lock();
  }
}

void ReportStream::StopKeepAlive() {
  {
    std::lock_guard<std::mutex> lock(keep_alive_mu_);
    keep_alive_stop_ = true;
  }
  keep_alive_cv_.notify_all();
  if (keep_alive_.joinable()) keep_alive_.join();
}

void ReportStream::ReadCommands() {
  v1::WorkerCommand command;
  while (stream_->Read(&command)) {
    switch (command.action()) {
      case v1::WorkerCommand::ACTION_CHECKPOINT:
        commands_.checkpoint.store(true);
        break;
      case v1::WorkerCommand::ACTION_CANCEL:
        commands_.cancel.store(true);
        break;
      case v1::WorkerCommand::ACTION_STOP:
        commands_.stop.store(true);
        break;
      default:
        break;  // an action this worker does not know: a newer kilnd's; nothing to do
    }
  }
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    if (!closed_) SetBroken("kilnd ended the Report stream before this worker was done");
  }
  reader_done_.store(true);
}

std::string ReportStream::broken_reason() const {
  std::lock_guard<std::mutex> lock(reason_mu_);
  return broken_reason_;
}

absl::Status ReportStream::Send(const v1::WorkerReport& report) {
  std::lock_guard<std::mutex> lock(write_mu_);
  if (closed_) return absl::FailedPreconditionError("the Report stream is closed");
  if (broken_.load() || !Watched([&] { return stream_->Write(report); })) {
    return absl::UnavailableError("the Report stream to kilnd broke (kilnd went away?)");
  }
  last_sent_ = absl::Now();
  return absl::OkStatus();
}

absl::Status ReportStream::Close(const v1::WorkerReport& last, absl::Duration timeout) {
  StopKeepAlive();
  bool sent = false;
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    if (closed_) return absl::FailedPreconditionError("the Report stream is closed already");
    closed_ = true;
    sent = !broken_.load() && Watched([&] { return stream_->Write(last); });
    Watched([&] { return stream_->WritesDone(); });
  }
  // kilnd ends the call once it has taken the last report; one that does not is given up on.
  const absl::Time deadline = absl::Now() + timeout;
  while (!reader_done_.load() && absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!reader_done_.load()) context_->TryCancel();
  reader_.join();
  StopWatchdog();
  absl::Status status = FromGrpc(stream_->Finish(), "the Report stream");
  if (!status.ok()) return status;
  if (!sent) return absl::UnavailableError("the last report did not reach kilnd");
  return absl::OkStatus();
}

}  // namespace kiln::worker
