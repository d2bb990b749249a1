// What the trainer does differently when it is one rank of a data-parallel job: the rule that
// splits a global batch among ranks, one contiguous gradient buffer allreduced once per step,
// rank 0's state broadcast to the others, and sums of evaluation shards.
//
// The mathematics stay those of one process at the same global batch: every rank draws the same
// seeded shuffle and takes its slice of each batch; the loss gradient of a slice of `local`
// samples (a mean over `local`) is scaled by local / global, so the summed gradients are the mean
// over the global batch. Dropout draws from the offsets the single process would have used for
// the slice's samples; causal attention's dropout from a disjoint part of the step's stream. Only batch normalisation differs: its statistics are each rank's own
// (PyTorch's DDP without SyncBatchNorm).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/distributed/communicator.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"
#include "engine/optim/optimizer.h"
#include "engine/training_position.h"

namespace kiln {

// A rank's share of `count` samples: [offset, offset + count) of them.
struct BatchSlice {
  int64_t offset = 0;
  int64_t count = 0;
};

// The split rule: `count` samples over `size` ranks as evenly as possible; the first
// count % size ranks take one sample more, and slices follow in rank order (rank 0 first).
// 10 over 3: [0, 4), [4, 7), [7, 10).
BatchSlice SliceOf(int64_t count, int rank, int size);

// Checks that splitting batches of `batch_size` from `samples` over `size` ranks gives every
// rank at least one sample in every step, and batch normalisation more than one value per
// channel (CheckBatchNormBatches for the smallest slice). InvalidArgument naming the numbers.
absl::Status CheckDataParallelBatches(const ModelConfig& model, int64_t batch_size, int64_t samples,
                                      int size);

// A step's totals over every rank.
struct StepTotals {
  double loss = 0;      // mean over the global batch
  int64_t correct = 0;  // over the global batch
};

class DataParallel {
 public:
  // Moves every parameter gradient of `model` into one contiguous buffer (so one allreduce
  // covers them) and learns how dropout layers advance their streams. `comm`, `model` and
  // `optimizer` must outlive this; `comm` must work on `backend`'s memory.
  static absl::StatusOr<std::unique_ptr<DataParallel>> Create(Communicator* comm, Backend* backend,
                                                              Model* model, Optimizer* optimizer);

  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  BatchSlice Slice(int64_t count) const { return SliceOf(count, rank(), size()); }

  // Makes every rank hold rank 0's parameters, buffers, optimizer state and `*position` (a
  // collective). First checks that every rank has the same model structure and the same
  // `must_agree` values (dataset size, batch size, ...): FailedPrecondition on every rank when
  // one differs, before any state moves.
  absl::Status BroadcastFromRoot(TrainingPosition* position,
                                 const std::vector<int64_t>& must_agree);

  // Makes every rank hold rank 0's buffers (batch normalisation's running statistics, which
  // each rank updates from its own slices): before evaluations and at epoch ends, so that every
  // rank evaluates, and rank 0 saves, the same model. The statistics are rank 0's, as DDP's
  // broadcast_buffers makes them.
  absl::Status BroadcastBuffers();

  // Before a training step's forward: points dropout streams at the slice's samples of the
  // global batch.
  absl::Status BeginStep(BatchSlice slice);
  // After the loss: scales its gradient `dout` from a mean over the slice to its share of a mean
  // over `global` samples.
  absl::Status ScaleLossGradient(BatchSlice slice, int64_t global, Tensor* dout);
  // After backward: sums gradients, and the slice's mean `loss` and `correct` count, over every
  // rank in one allreduce; moves dropout streams past the global batch. Every rank then holds
  // the global batch's mean gradients.
  absl::StatusOr<StepTotals> AllreduceStep(BatchSlice slice, int64_t global, float loss,
                                           int32_t correct);
  // values[0:n] (host) = their sums over every rank (through a device scratch tensor).
  absl::Status AllreduceHost(float* values, int n);

 private:
  DataParallel(Communicator* comm, Backend* backend, Model* model, Optimizer* optimizer)
      : comm_(comm), backend_(backend), model_(model), optimizer_(optimizer) {}
  absl::Status BroadcastTensor(const Tensor& t);
  absl::Status BroadcastHostBytes(std::string* bytes);

  Communicator* comm_;
  Backend* backend_;
  Model* model_;
  Optimizer* optimizer_;
  Tensor flat_;  // every gradient, padded, then kTailFloats step scalars
  Tensor tail_;  // a view of flat_'s step scalars
  int64_t grad_floats_ = 0;
  Tensor scratch_;     // AllreduceHost's device staging
  Tensor host_bytes_;  // BroadcastHostBytes's device staging (U8)
  // Per dropout layer (model order): values one sample draws (0 where p is 0); and the offsets at
  // the step's start.
  std::vector<uint64_t> dropout_per_sample_, step_offsets_;
};

}  // namespace kiln
