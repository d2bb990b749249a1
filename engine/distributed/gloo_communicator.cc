#include "engine/distributed/gloo_communicator.h"

#include <chrono>
#include <exception>

#include "absl/strings/str_cat.h"
#include "engine/distributed/gloo_store_adapter.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"

namespace kiln {

namespace {

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// Gloo's messages say what broke ("Timed out waiting 5000ms for recv operation to complete",
// "Connection closed by peer [127.0.0.1]:41234"); a timeout is the usual sign of a dead rank.
std::string Explain(const std::exception& e) {
  return absl::StrCat(e.what(), " (a rank has died, hung or cannot be reached)");
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    KeyValueStore* store, int rank, int size, const GlooOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo: rank ", rank, " of ", size, " ranks is not a rank"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("gloo: the timeout must be positive");
  }
  auto comm = std::unique_ptr<GlooCommunicator>(new GlooCommunicator(rank, size, options.timeout));
  try {
    gloo::transport::tcp::attr attr;
    if (options.interface.empty()) {
      attr.hostname = options.hostname;
    } else {
      attr.iface = options.interface;
    }
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(ToChrono(options.timeout));
    GlooStoreAdapter adapter(store, options.timeout);
    context->connectFullMesh(adapter, device);
    comm->context_ = std::move(context);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("gloo: rank ", rank, " of ", size,
                                               " could not join the others: ", Explain(e)));
  }
  return comm;
}

GlooCommunicator::~GlooCommunicator() = default;

template <typename Op>
absl::Status GlooCommunicator::Guarded(const char* what, Op op) {
  if (!failed_.ok()) return failed_;
  try {
    op();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    failed_ = absl::UnavailableError(
        absl::StrCat("gloo ", what, " failed on rank ", rank_, " of ", size_, ": ", Explain(e)));
    return failed_;
  }
}

absl::Status GlooCommunicator::AllreduceSum(float* data, size_t count) {
  if (size_ == 1 || count == 0) return absl::OkStatus();
  return Guarded("allreduce", [&] {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, count);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts.setTimeout(ToChrono(timeout_));
    gloo::allreduce(opts);
  });
}

absl::Status GlooCommunicator::Broadcast(void* data, size_t bytes, int root) {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(absl::StrCat("gloo broadcast: root ", root, " of ", size_));
  }
  if (size_ == 1 || bytes == 0) return absl::OkStatus();
  return Guarded("broadcast", [&] {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<uint8_t*>(data), bytes);
    opts.setRoot(root);
    opts.setTimeout(ToChrono(timeout_));
    gloo::broadcast(opts);
  });
}

absl::Status GlooCommunicator::Barrier() {
  if (size_ == 1) return absl::OkStatus();
  return Guarded("barrier", [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTimeout(ToChrono(timeout_));
    gloo::barrier(opts);
  });
}

}  // namespace kiln
