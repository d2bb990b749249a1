// What kilnd's server-streaming calls share: the write and cancel handling of a stream (one write
// in flight at a time, one Finish, and an end when a write fails or the call is cancelled), and a
// reactor for a call refused before it streams anything.
#pragma once

#include <grpcpp/support/server_callback.h>

#include <mutex>

#include "absl/status/status.h"
#include "server/grpc/status_mapping.h"

namespace kiln::server {

// A subclass says what to write next (WriteNextLocked) and calls WriteLocked, with mu_ held,
// whenever there may be something new to write. Thread-safe: writes complete, the call is
// cancelled and new messages arrive on different threads.
template <typename Message>
class StreamWriterReactor : public grpc::ServerWriteReactor<Message> {
 public:
  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the stream broke"));
      return;
    }
    WriteLocked();
  }

  // Finishes at once, or after the write in flight completes.
  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    if (!writing_) FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

 protected:
  // Starts the next write (StartWriteLocked), finishes (FinishLocked), or does nothing until
  // there is more to write. Called with mu_ held, only when no write is in flight and the
  // stream has not finished.
  virtual void WriteNextLocked() = 0;

  // Writes next unless a write is in flight or the stream has finished; finishes instead once
  // the call is cancelled.
  void WriteLocked() {
    if (finished_ || writing_) return;
    if (cancelled_) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      return;
    }
    WriteNextLocked();
  }
  // `message` must stay as it is until OnWriteDone.
  void StartWriteLocked(const Message* message) {
    writing_ = true;
    this->StartWrite(message);
  }
  // The first call finishes the stream; later ones do nothing.
  void FinishLocked(const grpc::Status& status) {
    if (finished_) return;
    finished_ = true;
    this->Finish(status);
  }
  bool finished_locked() const { return finished_; }

  std::mutex mu_;

 private:
  bool writing_ = false;    // guarded by mu_
  bool finished_ = false;   // guarded by mu_
  bool cancelled_ = false;  // guarded by mu_
};

// A write reactor that only finishes with an error, for requests refused up front.
template <typename Message>
class RefusedWrite : public grpc::ServerWriteReactor<Message> {
 public:
  explicit RefusedWrite(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

}  // namespace kiln::server
