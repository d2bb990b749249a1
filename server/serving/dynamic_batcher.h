// A small scheduler in front of one model version: concurrent requests queue up, run together on
// the version's InferenceSession (owned by one worker thread), and each caller gets its rows back.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/inference.h"
#include "server/serving/tensor_codec.h"

namespace kiln::serving {

struct BatchingOptions {
  // Samples per forward pass, and the session's capacity. 1 turns batching off: every sample
  // runs alone. Requests with more samples than this are run in several passes.
  int max_batch_size = 64;
  // How long the oldest queued request may wait for others before its batch runs, in
  // microseconds. 0 (the default, as in Triton): never wait, but requests that queued while a
  // pass ran still run together after it. Measured on the CPU (MLP, 64 clients): 10,001 req/s
  // at 0 against 7,326 at 500 us, and a lone request's p50 257 us against 941 us.
  int64_t max_queue_delay_us = 0;
};

class DynamicBatcher {
 public:
  // Counters since creation; read them while the batcher runs.
  struct Stats {
    int64_t requests = 0;  // requests completed
    int64_t samples = 0;   // samples run
    int64_t batches = 0;   // forward passes
  };

  // Takes `session` (max_batch() must be at least options.max_batch_size) and starts the worker
  // thread. `prepare_thread`, when given, runs on a thread before it drives the session (e.g. to
  // set its OpenMP thread count): on the worker at its start, and on a caller before it runs its
  // own request. `label` (e.g. model "m" version "1") starts the batcher's error messages.
  //
  // `callers_run_when_idle`: when no request will be waited for (max_batch_size 1 or
  // max_queue_delay_us 0), a request that finds nothing queued and no batch running runs on its
  // caller's thread, sparing the handoff to the worker and back (two thread wake-ups, most of the
  // batcher's cost for a batch of one). Only for sessions any thread may drive (CPU; not CUDA,
  // whose current device is per thread). One batch runs at a time either way.
  static absl::StatusOr<std::unique_ptr<DynamicBatcher>> Create(
      std::unique_ptr<InferenceSession> session, const BatchingOptions& options, std::string label,
      std::function<void()> prepare_thread = nullptr, bool callers_run_when_idle = false);
  // Runs what is queued, then stops the worker. No Run() may be in progress or start.
  ~DynamicBatcher();

  DynamicBatcher(const DynamicBatcher&) = delete;
  DynamicBatcher& operator=(const DynamicBatcher&) = delete;

  // Runs one request's samples and writes its outputs (see OutputBuffers); blocks until they are
  // written. Thread-safe; allocates nothing. The input and output memory must stay valid until
  // it returns.
  // What a finished Run reports for metrics: time queued before its first batch started, and the
  // size (in samples) of the largest batch it ran in.
  struct RunInfo {
    double queue_seconds = 0;
    int batch_size = 0;
  };
  absl::Status Run(const PixelInput& input, const OutputBuffers& outputs, RunInfo* info = nullptr);

  const BatchingOptions& options() const { return options_; }
  Stats stats() const;
  // Requests waiting for a batch now: queued with samples not yet in a running batch (a request
  // its caller runs, or one whose last samples are running, is not waiting). Lock-free.
  int64_t queued_requests() const { return queued_requests_.load(std::memory_order_relaxed); }

 private:
  // One caller's request, on the caller's stack while it waits.
  struct Pending {
    PixelInput input;
    OutputBuffers outputs;
    std::chrono::steady_clock::time_point enqueued;
    Pending* next = nullptr;
    int64_t staged = 0;     // samples handed to batches so far (worker only)
    int64_t finished = 0;   // samples whose outputs are written (worker only)
    absl::Status status;    // written by the worker before `state` leaves kQueued
    RunInfo info{-1.0, 0};  // worker only until kDone
    // kQueued -> kDone (the caller may read status; the worker still touches `state` to wake
    // it) -> kReleased (the worker is done with this object).
    std::atomic<uint32_t> state{0};
  };
  static constexpr uint32_t kQueued = 0, kDone = 1, kReleased = 2;

  // A run of consecutive samples of one request inside a batch.
  struct Segment {
    Pending* request;
    int64_t first;  // the request's first sample in this segment
    int64_t count;
    int64_t row;  // its first row in the batch's output buffers
  };

  DynamicBatcher(std::unique_ptr<InferenceSession> session, const BatchingOptions& options,
                 std::string label, std::function<void()> prepare_thread,
                 bool callers_run_when_idle);
  void Work();
  // Runs `p` alone on the calling thread; running_ must have been set for it.
  void RunOnCaller(Pending* p);
  // Stages segments_[0, num_segments_), runs them, scatters their rows and completes finished
  // requests. Only the thread that set running_.
  void RunBatch();
  void Complete(Pending* request, const absl::Status& status);

  const std::unique_ptr<InferenceSession> session_;
  const BatchingOptions options_;
  const std::string label_;
  const int64_t sample_elems_, classes_;

  std::mutex mu_;
  std::condition_variable wake_;
  Pending* head_ = nullptr;  // FIFO of requests with samples not yet staged
  Pending* tail_ = nullptr;
  int64_t queued_samples_ = 0;
  // The requests of the FIFO above; written under mu_, read without it for metrics.
  std::atomic<int64_t> queued_requests_{0};
  bool stopping_ = false;
  // A batch is running (on the worker or a caller); the session and the buffers below are its.
  bool running_ = false;
  const std::function<void()> prepare_thread_;
  const bool callers_run_when_idle_;

  // The worker's buffers, sized for a full batch up front.
  std::vector<Segment> segments_;
  int num_segments_ = 0;
  std::vector<uint8_t> u8_pixels_;
  std::vector<float> f32_pixels_;
  std::vector<float> probabilities_;
  std::vector<int32_t> classes_out_;

  std::atomic<int64_t> requests_done_{0}, samples_done_{0}, batches_done_{0};
  std::thread worker_;  // last: starts once everything above exists
};

}  // namespace kiln::serving
