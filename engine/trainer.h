// The training loop: shuffled batches, forward, loss, backward, optimizer step; evaluation after
// each epoch; callbacks for progress; cancellation; checkpoint and exact resume.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/data/augment.h"
#include "engine/data/dataset.h"
#include "engine/loss.h"
#include "engine/model/model_config.h"
#include "engine/optim/lr_schedule.h"
#include "engine/optim/optimizer_config.h"
#include "engine/precision.h"
#include "engine/rng.h"
#include "engine/training_position.h"

namespace kiln {

class Model;
class Optimizer;
struct TokenDataset;
class Loss;
class Communicator;
class DataParallel;

// Evaluation runs over the test set in batches of this many samples (fewer for the last).
inline constexpr int kEvalBatchSize = 1000;

struct TrainConfig {
  ModelConfig model;
  OptimizerConfig optimizer;
  LrScheduleConfig schedule;
  LossKind loss = LossKind::kCrossEntropy;
  float label_smoothing = 0;  // cross-entropy's, as PyTorch's; in [0, 1]
  int epochs = 1;
  int batch_size = 64;
  uint64_t seed = 0;
  PixelNorm norm;         // applied to raw pixels of every batch (train and test)
  AugmentConfig augment;  // random crop and flip of training batches only
  // Clips the gradients' global norm to this before each step (torch's clip_grad_norm_); 0: off.
  float grad_clip = 0;
  // The arithmetic of the backend a job creates for this run (BackendOptions::precision); the
  // trainer computes on whatever backend it is given and does not read it.
  Precision precision = Precision::kFp32;
  // A language model on a token dataset (max_iters > 0): it trains max_iters iterations of
  // batch_size windows, each step summing grad_accum micro-batches. Every eval_interval
  // iterations is an "epoch" (epochs is then ceil(max_iters / eval_interval)) that ends with
  // the validation loss over eval_iters batches.
  int64_t max_iters = 0;
  int64_t eval_interval = 0;
  int eval_iters = 20;
  int grad_accum = 1;
  // Data-parallel training when set with size() > 1 (not owned; must outlive the trainer):
  // this trainer is one rank. Every rank holds the whole dataset and the same config, draws the
  // same shuffle and trains its slice of each batch of batch_size (the global batch; SliceOf in
  // engine/distributed/data_parallel.h); gradients are averaged over the global batch.
  // Run, Evaluate and the events they send are then collectives with global values.
  // Null (or size 1): the single-process path, unchanged.
  Communicator* communicator = nullptr;
};

struct StepEvent {
  int epoch = 0;          // 1-based
  int step_in_epoch = 0;  // 1-based
  int steps_per_epoch = 0;
  int64_t global_step = 0;  // 1-based, across epochs
  float loss = 0;           // this batch's mean loss
  float lr = 0;
  double samples_per_sec = 0;  // over the epoch so far
};

struct EvalResult {
  double loss = 0;
  double accuracy = 0;  // fraction in [0, 1]
  int64_t samples = 0;
};

struct EpochEvent {
  int epoch = 0;              // 1-based
  double train_loss = 0;      // mean over the epoch's samples
  double train_accuracy = 0;  // fraction, over the epoch's batches
  EvalResult test;            // samples 0 when there is no test set
  double train_seconds = 0;
  double samples_per_sec = 0;
  float lr = 0;
};

class Trainer {
 public:
  struct Callbacks {
    std::function<void(const StepEvent&)> on_step;
    std::function<void(const EpochEvent&)> on_epoch;
    // Runs after every step and epoch end on the training thread; a non-OK status stops the run
    // with that status. The place for on-demand checkpoints; data-parallel, it runs on every
    // rank and only the one where writes_checkpoints() is true saves.
    std::function<absl::Status(Trainer&)> after_step;
  };

  // Checks the config against the datasets (shapes, classes) and builds the model on `backend`.
  // The datasets must outlive the trainer.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainConfig& config,
                                                         Backend* backend, const Dataset* train,
                                                         const Dataset* test);
  // A language model on token windows (config.max_iters > 0): batches are random windows of
  // T + 1 tokens of `tokens`' train split (engine/data/token_data.h's GatherWindows, a function
  // of the seed and the iteration, so a resumed run draws what the uninterrupted one would), and
  // each "epoch" of eval_interval iterations ends with EvaluateTokens. `tokens` must outlive the
  // trainer; it stays memory-mapped, one batch at a time is copied to the device.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainConfig& config,
                                                         Backend* backend,
                                                         const TokenDataset* tokens);
  ~Trainer();

  // Trains from the current position to config.epochs. Returns Cancelled when *cancel became
  // true (checked between steps), FailedPrecondition naming epoch and step when the loss
  // stops being finite, or the first error of an op or callback. Data-parallel, it first makes
  // every rank hold rank 0's weights, optimizer state and position (so a resumed job may load
  // its checkpoint on rank 0 alone), and a cancel must reach every rank.
  absl::Status Run(const Callbacks& callbacks, const std::atomic<bool>* cancel = nullptr);

  // Mean loss and accuracy of the current model over `data` (any dataset of the right shape).
  // Data-parallel, each rank evaluates its SliceOf the dataset and the sums are allreduced.
  absl::StatusOr<EvalResult> Evaluate(const Dataset& data);
  // A language model's mean loss and next-token accuracy over the validation split: eval_iters
  // batches of batch_size windows, the same windows at every evaluation (a curve without draw
  // noise). samples counts the windows. Data-parallel as Evaluate.
  absl::StatusOr<EvalResult> EvaluateTokens();

  // Writes weights, optimizer state and position as safetensors, atomically. Data-parallel,
  // only rank 0 writes (FailedPrecondition elsewhere): its state is every rank's.
  absl::Status SaveCheckpoint(const std::string& path);
  // Restores weights, optimizer state and position; the checkpoint must match the config.
  absl::Status LoadCheckpoint(const std::string& path);

  const TrainConfig& config() const { return config_; }
  const TrainingPosition& position() const { return position_; }
  Model& model() { return *model_; }
  Backend* backend() const { return backend_; }
  // The learning rate of the next step.
  float current_lr() const;
  // This trainer's rank (0 when not data-parallel), and whether it is the one that saves.
  int rank() const;
  bool writes_checkpoints() const { return rank() == 0; }

 private:
  Trainer(const TrainConfig& config, Backend* backend, const Dataset* train, const Dataset* test);
  absl::Status Init();
  absl::Status RunEpoch(const Callbacks& callbacks, const std::atomic<bool>* cancel);
  // The epoch's summary, the position moved to the next epoch's start, the evaluation, callbacks.
  absl::Status EndEpoch(const Callbacks& callbacks, int epoch, float lr,
                        const Rng::State& next_epoch_rng);
  absl::Status InitTokens();
  // Copies windows [slice] of batch `draw` of `split` (a token run's) to batch_x_/batch_y_.
  absl::Status LoadTokenBatch(bool validation, uint64_t draw, int64_t first, int count);
  int64_t StepsPerEpoch() const;
  // Steps of 1-based `epoch`: StepsPerEpoch, but a token run's last interval may be shorter.
  int StepsInEpoch(int epoch) const;
  bool token_run() const { return tokens_ != nullptr; }
  // The schedule's rates for 0-based `step` of the run, in 0-based `epoch`.
  ScheduledRates RatesForStep(int epoch, int64_t step) const;
  // Copies a dataset's pixels and labels to the device, and when `identity_index` is given, the
  // indices 0..size-1 for evaluating it in order.
  absl::Status Upload(const Dataset& d, Tensor* pixels, Tensor* labels, Tensor* identity_index);
  // Gathers `count` samples at device indices `index` into batch_x_/batch_y_, cropped and
  // flipped as `augment` (device memory, one per sample) says when it is not null.
  absl::Status LoadBatch(const Tensor& pixels, const Tensor& labels, int64_t sample_elems,
                         const int32_t* index, int count, const CropFlip* augment = nullptr);
  // Draws every augmentation decision of 1-based `epoch` on the host and copies them to
  // augment_decisions_, in shuffled order: sample i of step s at s * batch_size + i.
  absl::Status UploadAugmentDecisions(int epoch);

  // A step's loss and correct count, as they sit in step_scalars_ on the device.
  struct StepScalars {
    float loss = 0;
    int32_t correct = 0;
  };
  static_assert(sizeof(StepScalars) == 2 * sizeof(float));
  // One optimizer step: its batch (grad_accum micro-batches of a token run) forward and backward,
  // gradients averaged over ranks and clipped, the update. The step's mean loss and correct
  // count over the global batch of `count` samples.
  absl::StatusOr<StepScalars> TrainStep(int epoch, int s, int count, const CropFlip* augment);
  int32_t* CorrectSlot();  // step_scalars_'s second element
  // An evaluation batch (in batch_x_, batch_y_) forward and its loss, read back.
  absl::StatusOr<StepScalars> EvalBatch();
  // Data-parallel, each rank's evaluation sums become every rank's totals; else a no-op.
  absl::Status SumOverRanks(double* loss_sum, int64_t* correct);
  // Waits for the step and reads both scalars with one device-to-host copy.
  absl::StatusOr<StepScalars> ReadStepScalars();

  TrainConfig config_;
  Backend* backend_;
  const Dataset* train_;
  const Dataset* test_;
  const TokenDataset* tokens_ = nullptr;  // a token run's data, or null
  std::vector<int32_t> host_x_, host_y_;  // a token batch's windows before their copy
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<Loss> loss_;
  TrainingPosition position_;
  Rng shuffle_rng_;
  // Device copies of the datasets and per-batch buffers.
  Tensor train_pixels_, train_labels_, test_pixels_, test_labels_;
  Tensor perm_, eval_index_, batch_x_, batch_y_, dlogits_, step_scalars_, clip_scratch_;
  std::unique_ptr<DataParallel> dp_;  // null unless data-parallel over 2+ ranks
  // Training augmentation (config_.augment enabled): the images' geometry and the current
  // epoch's decisions on the device, a CropFlip per training sample.
  AugmentGeometry augment_geometry_;
  Tensor augment_decisions_;
};

}  // namespace kiln
