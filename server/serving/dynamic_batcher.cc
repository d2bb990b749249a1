#include "server/serving/dynamic_batcher.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kiln::serving {
namespace {

// A caller sleeps in the kernel until its request is done. std::atomic::wait would do, but
// libstdc++ spins with sched_yield first, which with many waiters on few cores costs more than
// the sleep it saves.
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr,
          nullptr, 0);
}

void FutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DynamicBatcher>> DynamicBatcher::Create(
    std::unique_ptr<InferenceSession> session, const BatchingOptions& options, std::string label,
    std::function<void()> prepare_thread, bool callers_run_when_idle) {
  if (session == nullptr) return absl::InvalidArgumentError(label + ": no session");
  if (options.max_batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": max_batch_size must be at least 1, got ", options.max_batch_size));
  }
  if (options.max_queue_delay_us < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": max_queue_delay_us must be at least 0, got ", options.max_queue_delay_us));
  }
  if (session->max_batch() < options.max_batch_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": the session holds batches of ", session->max_batch(),
                     ", less than max_batch_size ", options.max_batch_size));
  }
  return std::unique_ptr<DynamicBatcher>(
      new DynamicBatcher(std::move(session), options, std::move(label), std::move(prepare_thread),
                         callers_run_when_idle));
}

DynamicBatcher::DynamicBatcher(std::unique_ptr<InferenceSession> session,
                               const BatchingOptions& options, std::string label,
                               std::function<void()> prepare_thread, bool callers_run_when_idle)
    : session_(std::move(session)),
      options_(options),
      label_(std::move(label)),
      sample_elems_(session_->input_elems()),
      classes_(session_->num_classes()),
      prepare_thread_(std::move(prepare_thread)),
      callers_run_when_idle_(callers_run_when_idle &&
                             (options.max_batch_size == 1 || options.max_queue_delay_us == 0)) {
  const size_t cap = static_cast<size_t>(options_.max_batch_size);
  segments_.resize(cap);
  u8_pixels_.resize(cap * sample_elems_);
  f32_pixels_.resize(cap * sample_elems_);
  probabilities_.resize(cap * classes_);
  classes_out_.resize(cap);
  worker_ = std::thread(&DynamicBatcher::Work, this);
  pthread_setname_np(worker_.native_handle(), "kiln-batcher");
}

DynamicBatcher::~DynamicBatcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  worker_.join();
}

DynamicBatcher::Stats DynamicBatcher::stats() const {
  Stats s;
  s.requests = requests_done_.load(std::memory_order_relaxed);
  s.samples = samples_done_.load(std::memory_order_relaxed);
  s.batches = batches_done_.load(std::memory_order_relaxed);
  return s;
}

absl::Status DynamicBatcher::Run(const PixelInput& input, const OutputBuffers& outputs,
                                 RunInfo* info) {
  if (input.samples < 1 || input.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(label_, ": a request needs samples"));
  }
  Pending p;
  p.input = input;
  p.outputs = outputs;
  p.enqueued = std::chrono::steady_clock::now();
  bool wake;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_) return absl::UnavailableError(absl::StrCat(label_, " is being unloaded"));
    if (callers_run_when_idle_ && !running_ && head_ == nullptr) {
      running_ = true;
      lock.unlock();
      RunOnCaller(&p);
      if (info != nullptr) *info = p.info;
      return p.status;
    }
    // The worker sleeps either for an empty queue or, during its delay, for a full batch.
    wake = head_ == nullptr || queued_samples_ + input.samples >= options_.max_batch_size;
    if (tail_ != nullptr) {
      tail_->next = &p;
    } else {
      head_ = &p;
    }
    tail_ = &p;
    queued_samples_ += input.samples;
    queued_requests_.fetch_add(1, std::memory_order_relaxed);
  }
  if (wake) wake_.notify_one();
  while (p.state.load(std::memory_order_acquire) == kQueued) FutexWait(&p.state, kQueued);
  // The worker may still be inside FutexWake() on p.state; p must outlive that.
  while (p.state.load(std::memory_order_acquire) != kReleased) std::this_thread::yield();
  if (info != nullptr) *info = p.info;
  return p.status;
}

void DynamicBatcher::RunOnCaller(Pending* p) {
  if (prepare_thread_) prepare_thread_();
  p->staged = p->input.samples;
  num_segments_ = 0;
  // Batches of at most max_batch_size, as the worker would run them.
  const int64_t cap = options_.max_batch_size;
  while (p->finished < p->input.samples && p->status.ok()) {
    const int64_t first = p->finished;
    segments_[0] = Segment{p, first, std::min(cap, p->input.samples - first), 0};
    num_segments_ = 1;
    RunBatch();
    if (p->state.load(std::memory_order_relaxed) != kQueued) break;  // done or failed
  }
  std::lock_guard<std::mutex> lock(mu_);
  running_ = false;
  // Requests that queued meanwhile are the worker's.
  if (head_ != nullptr) wake_.notify_one();
}

void DynamicBatcher::Work() {
  if (prepare_thread_) prepare_thread_();
  const int64_t cap = options_.max_batch_size;
  const auto delay = std::chrono::microseconds(options_.max_queue_delay_us);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // A batch running on a caller has the session; what queued meanwhile waits for it to end.
    wake_.wait(lock,
               [this] { return (head_ != nullptr && !running_) || (stopping_ && !running_); });
    if (head_ == nullptr) return;  // stopping, and nothing is left
    if (cap > 1 && delay.count() > 0 && queued_samples_ < cap && !stopping_) {
      wake_.wait_until(lock, head_->enqueued + delay,
                       [&] { return queued_samples_ >= cap || stopping_; });
    }
    // Take requests in arrival order until the batch is full; a request that does not fit
    // stays at the head with its remaining samples, for the next batch.
    num_segments_ = 0;
    int64_t rows = 0;
    while (head_ != nullptr && rows < cap) {
      Pending* p = head_;
      const int64_t take = std::min(p->input.samples - p->staged, cap - rows);
      segments_[num_segments_++] = Segment{p, p->staged, take, 0};
      p->staged += take;
      rows += take;
      queued_samples_ -= take;
      if (p->staged < p->input.samples) break;
      head_ = p->next;
      if (head_ == nullptr) tail_ = nullptr;
      queued_requests_.fetch_sub(1, std::memory_order_relaxed);
    }
    running_ = true;
    lock.unlock();
    RunBatch();
    lock.lock();
    running_ = false;
  }
}

void DynamicBatcher::RunBatch() {
  // UINT8 requests take the first rows, FP32 ones the rows after them; the session normalises
  // each form as it does when it runs alone, then makes one forward pass of them all.
  int64_t n_u8 = 0, n_f32 = 0;
  for (int i = 0; i < num_segments_; ++i) {
    Segment& s = segments_[i];
    const PixelInput& in = s.request->input;
    if (in.encoding == PixelEncoding::kF32) continue;
    s.row = n_u8;
    uint8_t* dst = u8_pixels_.data() + n_u8 * sample_elems_;
    const int64_t n = s.count * sample_elems_, offset = s.first * sample_elems_;
    if (in.encoding == PixelEncoding::kU8) {
      std::memcpy(dst, static_cast<const uint8_t*>(in.data) + offset, n);
    } else {
      const uint32_t* src = static_cast<const uint32_t*>(in.data) + offset;
      for (int64_t j = 0; j < n; ++j) dst[j] = static_cast<uint8_t>(src[j]);
    }
    n_u8 += s.count;
  }
  for (int i = 0; i < num_segments_; ++i) {
    Segment& s = segments_[i];
    const PixelInput& in = s.request->input;
    if (in.encoding != PixelEncoding::kF32) continue;
    s.row = n_u8 + n_f32;
    std::memcpy(f32_pixels_.data() + n_f32 * sample_elems_,
                static_cast<const char*>(in.data) + s.first * sample_elems_ * sizeof(float),
                s.count * sample_elems_ * sizeof(float));
    n_f32 += s.count;
  }

  const auto started = std::chrono::steady_clock::now();
  const int batch = static_cast<int>(n_u8 + n_f32);
  for (int i = 0; i < num_segments_; ++i) {
    RunInfo& info = segments_[i].request->info;
    if (info.queue_seconds < 0) {
      info.queue_seconds =
          std::chrono::duration<double>(started - segments_[i].request->enqueued).count();
    }
    info.batch_size = std::max(info.batch_size, batch);
  }

  // Nothing thrown may leave the batcher's thread: it fails this batch's requests instead.
  absl::Status status;
  try {
    status = session_->Predict(
        {u8_pixels_.data(), static_cast<int>(n_u8), f32_pixels_.data(), static_cast<int>(n_f32)},
        probabilities_.data(), classes_out_.data());
  } catch (const std::bad_alloc&) {
    status = absl::ResourceExhaustedError("out of memory running the model (std::bad_alloc)");
  } catch (const std::exception& e) {
    status = absl::InternalError(absl::StrCat("internal error running the model: ", e.what()));
  }
  batches_done_.fetch_add(1, std::memory_order_relaxed);
  if (!status.ok()) {
    const absl::Status failed(status.code(), absl::StrCat(label_, ": ", status.message()));
    {
      // A request split across batches may still sit at the head; it ends here.
      std::lock_guard<std::mutex> lock(mu_);
      Pending* last = segments_[num_segments_ - 1].request;
      if (head_ == last) {
        queued_samples_ -= last->input.samples - last->staged;
        head_ = last->next;
        if (head_ == nullptr) tail_ = nullptr;
        queued_requests_.fetch_sub(1, std::memory_order_relaxed);
      }
    }
    for (int i = 0; i < num_segments_; ++i) Complete(segments_[i].request, failed);
    return;
  }
  samples_done_.fetch_add(n_u8 + n_f32, std::memory_order_relaxed);

  for (int i = 0; i < num_segments_; ++i) {
    const Segment& s = segments_[i];
    const OutputBuffers& out = s.request->outputs;
    if (out.probabilities != nullptr) {
      std::memcpy(out.probabilities + s.first * classes_ * sizeof(float),
                  probabilities_.data() + s.row * classes_, s.count * classes_ * sizeof(float));
    }
    if (out.classes != nullptr) {
      for (int64_t j = 0; j < s.count; ++j) {
        const int64_t c = classes_out_[s.row + j];
        std::memcpy(out.classes + (s.first + j) * sizeof(int64_t), &c, sizeof(int64_t));
      }
    }
    s.request->finished += s.count;
    if (s.request->finished == s.request->input.samples) Complete(s.request, absl::OkStatus());
  }
}

void DynamicBatcher::Complete(Pending* request, const absl::Status& status) {
  request->status = status;
  requests_done_.fetch_add(1, std::memory_order_relaxed);
  request->state.store(kDone, std::memory_order_release);
  FutexWake(&request->state);
  request->state.store(kReleased, std::memory_order_release);
}

}  // namespace kiln::serving
