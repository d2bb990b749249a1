#include "engine/distributed/data_parallel.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <variant>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kiln {

namespace {

// Each gradient starts at a multiple of 64 floats (256 bytes) of the flat buffer, as the
// allocators align tensors, so vectorised kernels and cuBLAS see the alignment they expect.
// The padding stays zero: nothing writes it, and sums of zeros are zeros.
constexpr int64_t kAlignFloats = 64;
// The step's scalars ride in the gradients' allreduce: loss * samples, correct, samples.
constexpr int64_t kTailFloats = 3;

int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// Keeps the flat buffer's memory alive as long as a view of it exists.
struct KeepOwner {
  Tensor owner;
  void operator()(Buffer* b) const { delete b; }
};

Tensor ViewOf(const Tensor& flat, int64_t offset, const Shape& shape) {
  auto* b = new Buffer{flat.f32() + offset, static_cast<size_t>(NumElements(shape)) * 4};
  return Tensor(std::shared_ptr<Buffer>(b, KeepOwner{flat}), DType::kF32, shape);
}

template <typename T>
void AppendRaw(std::string* out, const T& v) {
  static_assert(std::is_trivially_copyable_v<T>);
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
void ReadRaw(const std::string& in, size_t* at, T* v) {
  std::memcpy(v, in.data() + *at, sizeof(T));
  *at += sizeof(T);
}

}  // namespace

BatchSlice SliceOf(int64_t count, int rank, int size) {
  const int64_t base = count / size, extra = count % size;
  BatchSlice s;
  s.offset = rank * base + std::min<int64_t>(rank, extra);
  s.count = base + (rank < extra ? 1 : 0);
  return s;
}

absl::Status CheckDataParallelBatches(const ModelConfig& model, int64_t batch_size, int64_t samples,
                                      int size) {
  if (size <= 1 || batch_size < 1 || samples < 1) return absl::OkStatus();
  const int64_t last = samples % batch_size;
  int64_t smallest = std::numeric_limits<int64_t>::max();
  if (samples >= batch_size) smallest = batch_size / size;
  if (last > 0) smallest = std::min(smallest, last / size);
  if (smallest < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data-parallel over ", size, " ranks needs at least ", size,
        " samples in every batch, but ", samples, " training samples in batches of ", batch_size,
        " make a batch of ", last > 0 ? last : batch_size, "; change batch_size"));
  }
  if (smallest > 1) return absl::OkStatus();
  absl::Status bn = CheckBatchNormBatches(model, 1, 1);
  if (bn.ok()) return bn;
  return absl::InvalidArgumentError(
      absl::StrCat("data-parallel over ", size, " ranks: ", samples, " samples in batches of ",
                   batch_size, " give a rank a slice of 1 sample; ", bn.message()));
}

absl::StatusOr<std::unique_ptr<DataParallel>> DataParallel::Create(Communicator* comm,
                                                                   Backend* backend, Model* model,
                                                                   Optimizer* optimizer) {
  if (comm->device() != backend->kind()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the communicator works on ", comm->device() == DeviceKind::kCpu ? "host" : "CUDA",
        " memory but the backend is ", backend->name(), " (Gloo for cpu, NCCL for cuda)"));
  }
  auto dp = std::unique_ptr<DataParallel>(new DataParallel(comm, backend, model, optimizer));

  std::vector<NamedParameter> params = model->parameters();
  std::vector<int64_t> offsets;
  int64_t floats = 0;
  for (const NamedParameter& p : params) {
    floats = RoundUp(floats, kAlignFloats);
    offsets.push_back(floats);
    floats += p.param->grad.numel();
  }
  dp->grad_floats_ = RoundUp(floats, kAlignFloats);
  KILN_ASSIGN_OR_RETURN(dp->flat_,
                        backend->Allocate(DType::kF32, {dp->grad_floats_ + kTailFloats}));
  for (size_t i = 0; i < params.size(); ++i) {
    Parameter* p = params[i].param;
    Tensor view = ViewOf(dp->flat_, offsets[i], p->grad.shape());
    KILN_RETURN_IF_ERROR(backend->Copy(p->grad, &view, p->grad.bytes()));
    p->grad = std::move(view);  // layers and the optimizer read grads through the Parameter
  }
  dp->tail_ = ViewOf(dp->flat_, dp->grad_floats_, {kTailFloats});

  // A dropout layer draws numel(its input) values per forward, in order: its per-sample count
  // tells where a slice's samples start in the single process's stream. Causal attention draws
  // its weights' (H x T x T) then its output's (T x C) per sample, in two runs over the batch: a
  // rank's slice then draws its own disjoint part of the step's stream, not the single process's
  // values (equally random, but not the same bits as one process, unlike dropout's).
  KILN_ASSIGN_OR_RETURN(std::vector<Shape> shapes, InferShapes(model->config()));
  for (size_t i = 0; i < model->config().layers.size(); ++i) {
    const LayerConfig& layer = model->config().layers[i];
    if (const auto* d = std::get_if<DropoutConfig>(&layer)) {
      dp->dropout_per_sample_.push_back(d->p == 0.0f ? 0 : NumElements(shapes[i + 1]));
    } else if (const auto* a = std::get_if<CausalSelfAttentionConfig>(&layer)) {
      const int64_t t = shapes[i + 1][0];
      dp->dropout_per_sample_.push_back(a->dropout == 0.0f ? 0 : a->n_head * t * t + t * a->n_embd);
    }
  }
  if (dp->dropout_per_sample_.size() != model->random_offsets().size()) {
    return absl::UnimplementedError(
        "data-parallel training knows how dropout and attention draw random numbers, but this "
        "model has another layer with a random stream");
  }
  return dp;
}

absl::Status DataParallel::BroadcastTensor(const Tensor& t) {
  return comm_->Broadcast(t.raw(), t.bytes(), 0);
}

absl::Status DataParallel::BroadcastHostBytes(std::string* bytes) {
  if (bytes->empty()) return absl::OkStatus();
  if (host_bytes_.capacity_bytes() < bytes->size()) {
    KILN_ASSIGN_OR_RETURN(host_bytes_, backend_->Allocate(DType::kU8, {int64_t(bytes->size())}));
  }
  KILN_RETURN_IF_ERROR(backend_->CopyFromHost(bytes->data(), bytes->size(), &host_bytes_));
  KILN_RETURN_IF_ERROR(comm_->Broadcast(host_bytes_.raw(), bytes->size(), 0));
  return backend_->CopyToHost(host_bytes_, bytes->data(), bytes->size());
}

absl::Status DataParallel::BroadcastFromRoot(TrainingPosition* position,
                                             const std::vector<int64_t>& must_agree) {
  std::vector<NamedParameter> params = model_->parameters();
  std::vector<NamedBuffer> buffers = model_->buffers();
  std::vector<NamedState> state = optimizer_->state();

  // First the structure, so that ranks built from different configs fail together, by name,
  // instead of broadcasting into each other's tensors.
  std::string shape;
  AppendRaw(&shape, int64_t(params.size()));
  AppendRaw(&shape, grad_floats_);
  AppendRaw(&shape, int64_t(buffers.size()));
  AppendRaw(&shape, int64_t(state.size()));
  AppendRaw(&shape, int64_t(dropout_per_sample_.size()));
  AppendRaw(&shape, int64_t(must_agree.size()));
  for (int64_t v : must_agree) AppendRaw(&shape, v);
  std::string root_shape = shape;
  KILN_RETURN_IF_ERROR(BroadcastHostBytes(&root_shape));
  float differs = root_shape == shape ? 0.0f : 1.0f;
  KILN_RETURN_IF_ERROR(AllreduceHost(&differs, 1));
  if (differs > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data-parallel ranks disagree: ", differs, " of ", size(),
        " ranks differ from rank 0 in their model, optimizer, dataset size or batch size; every "
        "rank must be built from the same config and data"));
  }

  for (const NamedParameter& p : params) KILN_RETURN_IF_ERROR(BroadcastTensor(p.param->value));
  std::string host;
  for (const NamedBuffer& b : buffers) {
    if (b.buffer->kind == BufferKind::kF32) {
      KILN_RETURN_IF_ERROR(BroadcastTensor(b.buffer->value));
    } else {
      AppendRaw(&host, b.buffer->count);
    }
  }
  for (const NamedState& s : state) KILN_RETURN_IF_ERROR(BroadcastTensor(*s.tensor));

  // Host-side state: where training stands, the optimizer's step count, dropout's streams.
  static_assert(std::is_trivially_copyable_v<TrainingPosition>);
  AppendRaw(&host, *position);
  AppendRaw(&host, optimizer_->steps());
  const std::vector<uint64_t> offsets = model_->random_offsets();
  for (uint64_t o : offsets) AppendRaw(&host, o);
  KILN_RETURN_IF_ERROR(BroadcastHostBytes(&host));
  if (rank() == 0) return absl::OkStatus();

  size_t at = 0;
  for (const NamedBuffer& b : buffers) {
    if (b.buffer->kind != BufferKind::kF32) ReadRaw(host, &at, &b.buffer->count);
  }
  ReadRaw(host, &at, position);
  int64_t steps = 0;
  ReadRaw(host, &at, &steps);
  optimizer_->set_steps(steps);
  std::vector<uint64_t> root_offsets(offsets.size());
  for (uint64_t& o : root_offsets) ReadRaw(host, &at, &o);
  return model_->set_random_offsets(root_offsets);
}

absl::Status DataParallel::BroadcastBuffers() {
  std::string counts;
  for (const NamedBuffer& b : model_->buffers()) {
    if (b.buffer->kind == BufferKind::kF32) {
      KILN_RETURN_IF_ERROR(BroadcastTensor(b.buffer->value));
    } else {
      AppendRaw(&counts, b.buffer->count);
    }
  }
  KILN_RETURN_IF_ERROR(BroadcastHostBytes(&counts));
  size_t at = 0;
  for (const NamedBuffer& b : model_->buffers()) {
    if (b.buffer->kind != BufferKind::kF32) ReadRaw(counts, &at, &b.buffer->count);
  }
  return absl::OkStatus();
}

absl::Status DataParallel::BeginStep(BatchSlice slice) {
  step_offsets_ = model_->random_offsets();
  if (step_offsets_.empty()) return absl::OkStatus();
  std::vector<uint64_t> mine = step_offsets_;
  for (size_t i = 0; i < mine.size(); ++i) {
    mine[i] += static_cast<uint64_t>(slice.offset) * dropout_per_sample_[i];
  }
  return model_->set_random_offsets(mine);
}

absl::Status DataParallel::ScaleLossGradient(BatchSlice slice, int64_t global, Tensor* dout) {
  // dout is d(mean over the slice); its share of d(mean over the global batch) is local/global
  // of it (an exact power of two when the batch splits evenly over a power-of-two world).
  const float alpha = static_cast<float>(static_cast<double>(slice.count) / global);
  if (alpha == 1.0f) return absl::OkStatus();
  return backend_->Scale(dout->numel(), alpha, dout->f32());
}

absl::StatusOr<StepTotals> DataParallel::AllreduceStep(BatchSlice slice, int64_t global, float loss,
                                                       int32_t correct) {
  float tail[kTailFloats] = {loss * static_cast<float>(slice.count), static_cast<float>(correct),
                             static_cast<float>(slice.count)};
  KILN_RETURN_IF_ERROR(backend_->CopyFromHost(tail, sizeof(tail), &tail_));
  KILN_RETURN_IF_ERROR(comm_->AllreduceSum(flat_.f32(), static_cast<size_t>(flat_.numel())));
  KILN_RETURN_IF_ERROR(backend_->CopyToHost(tail_, tail, sizeof(tail)));
  if (static_cast<int64_t>(tail[2]) != global) {
    return absl::InternalError(absl::StrCat("data-parallel step: the ranks trained ", tail[2],
                                            " samples, not the global batch of ", global));
  }
  if (!step_offsets_.empty()) {
    std::vector<uint64_t> next = step_offsets_;
    for (size_t i = 0; i < next.size(); ++i) {
      next[i] += static_cast<uint64_t>(global) * dropout_per_sample_[i];
    }
    KILN_RETURN_IF_ERROR(model_->set_random_offsets(next));
  }
  StepTotals t;
  t.loss = static_cast<double>(tail[0]) / static_cast<double>(global);
  t.correct = static_cast<int64_t>(tail[1]);
  return t;
}

absl::Status DataParallel::AllreduceHost(float* values, int n) {
  if (n <= 0) return absl::OkStatus();
  if (scratch_.capacity_bytes() < static_cast<size_t>(n) * sizeof(float)) {
    KILN_ASSIGN_OR_RETURN(scratch_, backend_->Allocate(DType::kF32, {n}));
  }
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  KILN_RETURN_IF_ERROR(backend_->CopyFromHost(values, bytes, &scratch_));
  KILN_RETURN_IF_ERROR(comm_->AllreduceSum(scratch_.f32(), static_cast<size_t>(n)));
  return backend_->CopyToHost(scratch_, values, bytes);
}

}  // namespace kiln
