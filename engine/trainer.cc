#include "engine/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <variant>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/model/checkpoint.h"
#include "engine/data/csv_reader.h"
#include "engine/data/token_data.h"
#include "engine/distributed/communicator.h"
#include "engine/distributed/data_parallel.h"
#include "engine/inference.h"
#include "engine/loss.h"
#include "engine/model/model.h"
#include "engine/optim/grad_clip.h"
#include "engine/optim/lr_schedule.h"
#include "engine/optim/optimizer.h"
#include "engine/model/sequence_model.h"

namespace kiln {

namespace {

using Clock = std::chrono::steady_clock;
// Keeps the shuffling stream apart from the initialisation stream of the same seed.
constexpr uint64_t kShuffleStream = 0x5EED5A1E;
// Keeps a token run's validation windows apart from its training windows.
constexpr uint64_t kValidationStream = 0x7A11D;

absl::Status ValidateConfig(const TrainConfig& c) {
  if (c.epochs < 1)
    return absl::InvalidArgumentError(absl::StrCat("epochs must be >= 1, got ", c.epochs));
  if (c.batch_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("batch_size must be >= 1, got ", c.batch_size));
  }
  if (!(c.norm.std > 0.0f) || !std::isfinite(c.norm.scale) || !std::isfinite(c.norm.mean)) {
    return absl::InvalidArgumentError("normalisation needs a finite scale and mean and std > 0");
  }
  if (!(c.label_smoothing >= 0.0f && c.label_smoothing <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("label_smoothing must be in [0, 1], got ", c.label_smoothing));
  }
  if (c.label_smoothing > 0.0f && c.loss != LossKind::kCrossEntropy) {
    return absl::InvalidArgumentError("label_smoothing applies to the cross-entropy loss only");
  }
  if (c.schedule.kind == LrScheduleConfig::Kind::kOneCycle && c.schedule.cycle_momentum &&
      c.optimizer.kind == OptimizerConfig::Kind::kSgd && c.optimizer.momentum <= 0.0f) {
    return absl::InvalidArgumentError(
        "one-cycle's cycle_momentum needs SGD momentum > 0 (or cycle_momentum false)");
  }
  if (!(c.grad_clip >= 0.0f) || !std::isfinite(c.grad_clip)) {
    return absl::InvalidArgumentError(absl::StrCat("grad_clip must be >= 0, got ", c.grad_clip));
  }
  if (c.max_iters > 0) {
    if (c.eval_interval < 1 || c.eval_iters < 1 || c.grad_accum < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("a token run needs eval_interval, eval_iters and grad_accum >= 1, got ",
                       c.eval_interval, ", ", c.eval_iters, ", ", c.grad_accum));
    }
    if (int64_t{c.epochs} != (c.max_iters + c.eval_interval - 1) / c.eval_interval) {
      return absl::InvalidArgumentError(
          absl::StrCat("a token run's epochs are its evaluation intervals: ceil(max_iters ",
                       c.max_iters, " / eval_interval ", c.eval_interval, "), not ", c.epochs));
    }
  } else if (c.grad_accum != 1) {
    return absl::InvalidArgumentError("gradient accumulation is for token runs (max_iters > 0)");
  }
  for (size_t i = 0; i < c.norm.channel_std.size(); ++i) {
    if (!(c.norm.channel_std[i] > 0.0f) || !std::isfinite(c.norm.channel_std[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("normalisation: channel ", i, "'s std must be finite and > 0"));
    }
  }
  for (float m : c.norm.channel_mean) {
    if (!std::isfinite(m)) return absl::InvalidArgumentError("normalisation: a mean is not finite");
  }
  // The channels must divide the model's input (and come in pairs, at most kMaxNormChannels).
  KILN_RETURN_IF_ERROR(FoldPixelNorm(c.norm, NumElements(c.model.input_shape)).status());
  return ValidateSchedule(c.schedule, c.optimizer.lr);
}

// An empty split (no test set) fits every model.
absl::Status CheckData(const Dataset& d, const char* which, const ModelConfig& model) {
  if (d.size == 0) return absl::OkStatus();
  return CheckModelFitsData(model, d.sample_shape, d.num_classes, which);
}

Shape WithBatch(int64_t batch, const Shape& s) {
  Shape out = s;
  out.insert(out.begin(), batch);
  return out;
}

}  // namespace

Trainer::Trainer(const TrainConfig& config, Backend* backend, const Dataset* train,
                 const Dataset* test)
    : config_(config), backend_(backend), train_(train), test_(test) {}

Trainer::~Trainer() = default;

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainConfig& config,
                                                         Backend* backend, const Dataset* train,
                                                         const Dataset* test) {
  KILN_RETURN_IF_ERROR(ValidateConfig(config));
  if (train == nullptr || train->size == 0) {
    return absl::InvalidArgumentError("the training set is empty");
  }
  if (config.max_iters > 0) {
    return absl::InvalidArgumentError(
        "max_iters is for language models on token data; this dataset holds samples: set epochs");
  }
  auto trainer = std::unique_ptr<Trainer>(new Trainer(config, backend, train, test));
  KILN_RETURN_IF_ERROR(trainer->Init());
  return trainer;
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainConfig& config,
                                                         Backend* backend,
                                                         const TokenDataset* tokens) {
  KILN_RETURN_IF_ERROR(ValidateConfig(config));
  if (tokens == nullptr || tokens->train.tokens() == 0) {
    return absl::InvalidArgumentError("the token dataset has no training tokens");
  }
  if (config.max_iters <= 0) {
    return absl::InvalidArgumentError(
        "a token dataset trains a language model for max_iters iterations: set max_iters");
  }
  auto trainer = std::unique_ptr<Trainer>(new Trainer(config, backend, nullptr, nullptr));
  trainer->tokens_ = tokens;
  KILN_RETURN_IF_ERROR(trainer->InitTokens());
  return trainer;
}

absl::Status Trainer::InitTokens() {
  // A text dataset's vocabulary, or for pre-tokenized shards the ids they hold.
  const int64_t vocab = tokens_->vocab_size > 0 ? tokens_->vocab_size : tokens_->max_token + 1;
  KILN_RETURN_IF_ERROR(CheckModelFitsTokens(config_.model, vocab, "the dataset"));
  KILN_ASSIGN_OR_RETURN(model_, Model::Build(config_.model, backend_, config_.seed));
  KILN_ASSIGN_OR_RETURN(optimizer_,
                        Optimizer::Create(config_.optimizer, backend_, model_->parameters()));
  loss_ = std::make_unique<Loss>(config_.loss, backend_, config_.label_smoothing);
  const int64_t bs = config_.batch_size;
  if (Communicator* comm = config_.communicator; comm != nullptr && comm->size() > 1) {
    // Every rank takes a slice of every batch's windows: at least one each.
    KILN_RETURN_IF_ERROR(CheckDataParallelBatches(config_.model, bs, bs, comm->size()));
    KILN_ASSIGN_OR_RETURN(dp_,
                          DataParallel::Create(comm, backend_, model_.get(), optimizer_.get()));
  }
  const int64_t t = config_.model.input_shape[0];
  host_x_.resize(bs * t);
  host_y_.resize(bs * t);
  KILN_ASSIGN_OR_RETURN(batch_x_, backend_->Allocate(DType::kI32, {bs, t}));
  KILN_ASSIGN_OR_RETURN(batch_y_, backend_->Allocate(DType::kI32, {bs * t}));
  KILN_ASSIGN_OR_RETURN(dlogits_,
                        backend_->Allocate(DType::kF32, WithBatch(bs, model_->output_shape())));
  KILN_ASSIGN_OR_RETURN(step_scalars_, backend_->Allocate(DType::kF32, {2}));
  if (config_.grad_clip > 0) {
    KILN_ASSIGN_OR_RETURN(clip_scratch_, backend_->Allocate(DType::kF32, {1}));
  }
  // A split too short for one window fails here, naming it, not at the first step.
  KILN_RETURN_IF_ERROR(LoadTokenBatch(false, 0, 0, 1));
  if (tokens_->val.tokens() > 0) KILN_RETURN_IF_ERROR(LoadTokenBatch(true, 0, 0, 1));
  return absl::OkStatus();
}

absl::Status Trainer::LoadTokenBatch(bool validation, uint64_t draw, int64_t first, int count) {
  const int64_t t = config_.model.input_shape[0];
  const TokenSplit& split = validation ? tokens_->val : tokens_->train;
  const uint64_t seed = validation ? config_.seed ^ kValidationStream : config_.seed;
  absl::Status drawn =
      GatherWindows(split, t, seed, draw, first, count, host_x_.data(), host_y_.data());
  if (!drawn.ok()) {
    return absl::Status(drawn.code(), absl::StrCat(validation ? "validation" : "training",
                                                   " tokens: ", drawn.message()));
  }
  batch_x_.Reshape({count, t});
  batch_y_.Reshape({count * t});
  const size_t bytes = static_cast<size_t>(count * t) * sizeof(int32_t);
  KILN_RETURN_IF_ERROR(backend_->CopyFromHost(host_x_.data(), bytes, &batch_x_));
  return backend_->CopyFromHost(host_y_.data(), bytes, &batch_y_);
}

absl::Status Trainer::Init() {
  // A float dataset (a CSV table) is standardised per feature with its train split's statistics,
  // which the checkpoint then carries to serving.
  if (train_->has_features()) config_.norm = FeatureStandardisation(*train_);
  KILN_ASSIGN_OR_RETURN(model_, Model::Build(config_.model, backend_, config_.seed));
  KILN_RETURN_IF_ERROR(CheckData(*train_, "training", config_.model));
  KILN_RETURN_IF_ERROR(CheckBatchNormBatches(config_.model, config_.batch_size, train_->size));
  if (test_ != nullptr) KILN_RETURN_IF_ERROR(CheckData(*test_, "test", config_.model));
  if (config_.augment.enabled()) {
    absl::StatusOr<AugmentGeometry> g = AugmentImageGeometry(
        config_.augment, train_->sample_shape, train_->has_features(), config_.norm.channels());
    if (!g.ok()) return absl::InvalidArgumentError(absl::StrCat("augment: ", g.status().message()));
    augment_geometry_ = *g;
  }
  KILN_ASSIGN_OR_RETURN(optimizer_,
                        Optimizer::Create(config_.optimizer, backend_, model_->parameters()));
  loss_ = std::make_unique<Loss>(config_.loss, backend_, config_.label_smoothing);
  if (Communicator* comm = config_.communicator; comm != nullptr && comm->size() > 1) {
    KILN_RETURN_IF_ERROR(
        CheckDataParallelBatches(config_.model, config_.batch_size, train_->size, comm->size()));
    KILN_ASSIGN_OR_RETURN(dp_,
                          DataParallel::Create(comm, backend_, model_.get(), optimizer_.get()));
  }

  // The datasets go to the device once, as uint8; batches are gathered and normalised there.
  KILN_RETURN_IF_ERROR(Upload(*train_, &train_pixels_, &train_labels_, nullptr));
  if (test_ != nullptr && test_->size > 0) {
    KILN_RETURN_IF_ERROR(Upload(*test_, &test_pixels_, &test_labels_, &eval_index_));
  }
  const int64_t cap = std::max(config_.batch_size, kEvalBatchSize);
  KILN_ASSIGN_OR_RETURN(perm_, backend_->Allocate(DType::kI32, {train_->size}));
  KILN_ASSIGN_OR_RETURN(batch_x_,
                        backend_->Allocate(DType::kF32, WithBatch(cap, config_.model.input_shape)));
  KILN_ASSIGN_OR_RETURN(batch_y_, backend_->Allocate(DType::kI32, {cap}));
  KILN_ASSIGN_OR_RETURN(dlogits_,
                        backend_->Allocate(DType::kF32, WithBatch(cap, model_->output_shape())));
  // The loss (f32) and the correct count (i32) side by side: one device-to-host copy a step.
  KILN_ASSIGN_OR_RETURN(step_scalars_, backend_->Allocate(DType::kF32, {2}));
  if (config_.grad_clip > 0) {
    KILN_ASSIGN_OR_RETURN(clip_scratch_, backend_->Allocate(DType::kF32, {1}));
  }
  if (config_.augment.enabled()) {
    // CropFlip is three int32s (backend.h).
    KILN_ASSIGN_OR_RETURN(augment_decisions_, backend_->Allocate(DType::kI32, {3 * train_->size}));
  }

  shuffle_rng_.Seed(config_.seed ^ kShuffleStream);
  position_.epoch_rng = shuffle_rng_.state();
  return absl::OkStatus();
}

float Trainer::current_lr() const {
  const int epoch = std::min(position_.epochs_done, config_.epochs - 1);
  const int64_t steps = StepsPerEpoch();
  return RatesForStep(epoch, int64_t{epoch} * steps + position_.step_in_epoch).lr;
}

int Trainer::rank() const { return dp_ == nullptr ? 0 : dp_->rank(); }

int64_t Trainer::StepsPerEpoch() const {
  if (token_run()) return config_.eval_interval;
  return (train_->size + config_.batch_size - 1) / config_.batch_size;
}

int Trainer::StepsInEpoch(int epoch) const {
  const int64_t steps = StepsPerEpoch();
  if (!token_run()) return static_cast<int>(steps);
  return static_cast<int>(std::min(steps, config_.max_iters - int64_t{epoch - 1} * steps));
}

ScheduledRates Trainer::RatesForStep(int epoch, int64_t step) const {
  SchedulePoint point;
  point.epoch = epoch;
  point.total_epochs = config_.epochs;
  point.step = step;
  point.steps_per_epoch = StepsPerEpoch();
  if (token_run()) point.total_steps = config_.max_iters;
  return ScheduledRatesAt(config_.optimizer.lr, config_.schedule, point);
}

absl::Status Trainer::Upload(const Dataset& d, Tensor* pixels, Tensor* labels,
                             Tensor* identity_index) {
  if (d.has_features() != train_->has_features()) {
    return absl::InvalidArgumentError("a float (CSV) dataset and a pixel one cannot be mixed");
  }
  if (d.has_features()) {
    KILN_ASSIGN_OR_RETURN(*pixels, backend_->Allocate(DType::kF32, {d.size, d.sample_elems()}));
    KILN_RETURN_IF_ERROR(
        backend_->CopyFromHost(d.features.data(), d.features.size() * sizeof(float), pixels));
  } else {
    KILN_ASSIGN_OR_RETURN(*pixels, backend_->Allocate(DType::kU8, {d.size, d.sample_elems()}));
    KILN_RETURN_IF_ERROR(backend_->CopyFromHost(d.pixels.data(), d.pixels.size(), pixels));
  }
  KILN_ASSIGN_OR_RETURN(*labels, backend_->Allocate(DType::kI32, {d.size}));
  KILN_RETURN_IF_ERROR(
      backend_->CopyFromHost(d.labels.data(), d.labels.size() * sizeof(int32_t), labels));
  if (identity_index == nullptr) return absl::OkStatus();
  std::vector<int32_t> identity(d.size);
  for (int32_t i = 0; i < d.size; ++i) identity[i] = i;
  KILN_ASSIGN_OR_RETURN(*identity_index, backend_->Allocate(DType::kI32, {d.size}));
  return backend_->CopyFromHost(identity.data(), identity.size() * sizeof(int32_t), identity_index);
}

absl::Status Trainer::UploadAugmentDecisions(int epoch) {
  // A whole epoch's decisions in one copy, as the permutation: no copy and no stream
  // synchronisation per step. Each is a function of (seed, epoch, step, sample), so a run resumed
  // mid-epoch draws the same ones.
  const int64_t n = train_->size;
  const int bs = config_.batch_size;
  std::vector<CropFlip> decisions(n);
  for (int64_t i = 0; i < n; ++i) {
    decisions[i] = DrawCropFlip(config_.augment, config_.seed, epoch, i / bs, i % bs);
  }
  return backend_->CopyFromHost(decisions.data(), decisions.size() * sizeof(CropFlip),
                                &augment_decisions_);
}

absl::Status Trainer::LoadBatch(const Tensor& pixels, const Tensor& labels, int64_t sample_elems,
                                const int32_t* index, int count, const CropFlip* augment) {
  batch_x_.Reshape(WithBatch(count, config_.model.input_shape));
  batch_y_.Reshape({count});
  if (augment != nullptr) {
    return backend_->GatherAugmentNormalize(count, augment_geometry_, index, pixels.u8(),
                                            labels.i32(), augment, config_.norm, batch_x_.f32(),
                                            batch_y_.i32());
  }
  if (pixels.dtype() == DType::kF32) {
    return backend_->GatherNormalizeF32(count, sample_elems, index, pixels.f32(), labels.i32(),
                                        config_.norm, batch_x_.f32(), batch_y_.i32());
  }
  return backend_->GatherNormalize(count, sample_elems, index, pixels.u8(), labels.i32(),
                                   config_.norm, batch_x_.f32(), batch_y_.i32());
}

absl::Status Trainer::Run(const Callbacks& callbacks, const std::atomic<bool>* cancel) {
  if (dp_ != nullptr) {
    // What every rank must agree on: the data's size, the batch, the run's length.
    const int64_t train_size = token_run() ? tokens_->train.tokens() : train_->size;
    const int64_t test_size =
        token_run() ? tokens_->val.tokens() : (test_ != nullptr ? test_->size : 0);
    KILN_RETURN_IF_ERROR(dp_->BroadcastFromRoot(
        &position_, {train_size, config_.batch_size, config_.epochs, test_size}));
  }
  while (position_.epochs_done < config_.epochs) {
    KILN_RETURN_IF_ERROR(RunEpoch(callbacks, cancel));
  }
  return absl::OkStatus();
}

absl::StatusOr<Trainer::StepScalars> Trainer::TrainStep(int epoch, int s, int count,
                                                        const CropFlip* augment) {
  const int bs = config_.batch_size;
  const int micro = token_run() ? config_.grad_accum : 1;
  const int64_t iteration = int64_t{epoch - 1} * StepsPerEpoch() + s;
  // Data-parallel, this rank trains its slice of the batch.
  const BatchSlice mine = dp_ != nullptr ? dp_->Slice(count) : BatchSlice{0, count};
  KILN_RETURN_IF_ERROR(model_->ZeroGrad());
  StepScalars local;  // this rank's, a mean over its micro-batches when it reads them itself
  double micro_loss_sum = 0;
  for (int m = 0; m < micro; ++m) {
    if (token_run()) {
      KILN_RETURN_IF_ERROR(LoadTokenBatch(false, static_cast<uint64_t>(iteration * micro + m),
                                          mine.offset, static_cast<int>(mine.count)));
    } else {
      KILN_RETURN_IF_ERROR(
          LoadBatch(train_pixels_, train_labels_, train_->sample_elems(),
                    perm_.i32() + int64_t{s} * bs + mine.offset, static_cast<int>(mine.count),
                    augment != nullptr ? augment + int64_t{s} * bs + mine.offset : nullptr));
    }
    if (dp_ != nullptr) KILN_RETURN_IF_ERROR(dp_->BeginStep(mine));
    KILN_ASSIGN_OR_RETURN(const Tensor* out, model_->Forward(batch_x_, Mode::kTrain));
    dlogits_.Reshape(out->shape());
    KILN_RETURN_IF_ERROR(
        loss_->Compute(*out, batch_y_, step_scalars_.f32(), CorrectSlot(), &dlogits_));
    if (dp_ != nullptr) KILN_RETURN_IF_ERROR(dp_->ScaleLossGradient(mine, count, &dlogits_));
    // Accumulated micro-batches: the step's gradient is their mean, as nanoGPT's loss / steps.
    if (micro > 1) {
      KILN_RETURN_IF_ERROR(backend_->Scale(dlogits_.numel(), 1.0f / micro, dlogits_.f32()));
    }
    KILN_RETURN_IF_ERROR(model_->Backward(dlogits_));
    if (micro > 1 || dp_ != nullptr) {
      KILN_ASSIGN_OR_RETURN(const StepScalars one, ReadStepScalars());
      micro_loss_sum += one.loss;
      local.correct += one.correct;
    }
  }
  local.loss = static_cast<float>(micro_loss_sum / micro);
  StepScalars scalars = local;
  if (dp_ != nullptr) {
    KILN_ASSIGN_OR_RETURN(const StepTotals totals,
                          dp_->AllreduceStep(mine, count, local.loss, local.correct));
    scalars = {static_cast<float>(totals.loss), static_cast<int32_t>(totals.correct)};
  }
  if (config_.grad_clip > 0) {
    absl::StatusOr<float> norm =
        ClipGradNorm(backend_, model_->parameters(), config_.grad_clip, &clip_scratch_);
    if (!norm.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "gradient clipping at epoch ", epoch, " step ", s + 1, ": ", norm.status().message()));
    }
  }
  // The step's place in the run, not global_step: a resumed job with more epochs keeps the
  // epochs it has done where they were.
  const ScheduledRates rates = RatesForStep(epoch - 1, int64_t{epoch - 1} * StepsPerEpoch() + s);
  if (rates.momentum.has_value()) optimizer_->set_momentum(*rates.momentum);
  KILN_RETURN_IF_ERROR(optimizer_->Step(rates.lr));
  // One process, one micro-batch: the scalars are read after the update is queued, so the
  // device runs the step while the host waits once.
  if (dp_ == nullptr && micro == 1) {
    KILN_ASSIGN_OR_RETURN(scalars, ReadStepScalars());
  }
  return scalars;
}

absl::Status Trainer::RunEpoch(const Callbacks& callbacks, const std::atomic<bool>* cancel) {
  const int epoch = position_.epochs_done + 1;
  const int steps = StepsInEpoch(epoch);
  // A token run's sample is a window (of T predicted tokens); a step takes grad_accum batches.
  const int64_t per_sample = token_run() ? config_.grad_accum : 1;
  float lr = current_lr();

  const CropFlip* augment = nullptr;  // training batches only; Evaluate never augments
  Rng::State next_epoch_rng = position_.epoch_rng;
  if (!token_run()) {
    // The epoch's order comes from the RNG state saved at its start, so a resumed epoch replays
    // it. (A token run's windows are a function of the seed and the iteration instead.)
    shuffle_rng_.set_state(position_.epoch_rng);
    const std::vector<int32_t> perm = shuffle_rng_.Permutation(static_cast<int32_t>(train_->size));
    next_epoch_rng = shuffle_rng_.state();
    KILN_RETURN_IF_ERROR(backend_->CopyFromHost(perm.data(), perm.size() * 4, &perm_));
    if (config_.augment.enabled()) {
      KILN_RETURN_IF_ERROR(UploadAugmentDecisions(epoch));
      augment = reinterpret_cast<const CropFlip*>(augment_decisions_.i32());
    }
  }

  TrainingPosition& p = position_;
  const auto start = Clock::now();
  const double seconds_before = p.epoch_seconds;
  for (int s = p.step_in_epoch; s < steps; ++s) {
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
      return absl::CancelledError(absl::StrCat("cancelled at epoch ", epoch, " step ", s));
    }
    const int count =
        token_run() ? config_.batch_size
                    : static_cast<int>(std::min<int64_t>(
                          config_.batch_size, train_->size - int64_t{s} * config_.batch_size));
    KILN_ASSIGN_OR_RETURN(const StepScalars scalars, TrainStep(epoch, s, count, augment));
    lr = RatesForStep(epoch - 1, int64_t{epoch - 1} * StepsPerEpoch() + s).lr;
    const float loss = scalars.loss;
    if (!std::isfinite(loss)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "loss became ", std::isnan(loss) ? "NaN" : "Inf", " at epoch ", epoch, " step ", s + 1));
    }
    const int64_t samples = count * per_sample;
    p.epoch_loss_sum += static_cast<double>(loss) * samples;
    p.epoch_correct += scalars.correct;
    p.epoch_samples += samples;
    p.step_in_epoch = s + 1;
    ++p.global_step;
    p.epoch_seconds = seconds_before + std::chrono::duration<double>(Clock::now() - start).count();
    if (callbacks.on_step) {
      StepEvent e;
      e.epoch = epoch;
      e.step_in_epoch = s + 1;
      e.steps_per_epoch = steps;
      e.global_step = p.global_step;
      e.loss = loss;
      e.lr = lr;
      e.samples_per_sec = p.epoch_samples / std::max(p.epoch_seconds, 1e-9);
      callbacks.on_step(e);
    }
    if (callbacks.after_step && s + 1 < steps) KILN_RETURN_IF_ERROR(callbacks.after_step(*this));
  }
  return EndEpoch(callbacks, epoch, lr, next_epoch_rng);
}

absl::Status Trainer::EndEpoch(const Callbacks& callbacks, int epoch, float lr,
                               const Rng::State& next_epoch_rng) {
  TrainingPosition& p = position_;
  EpochEvent e;
  e.epoch = epoch;
  e.train_loss = p.epoch_loss_sum / std::max<int64_t>(p.epoch_samples, 1);
  // A token run's correct count is over positions, T per window.
  const int64_t predictions = p.epoch_samples * (token_run() ? config_.model.input_shape[0] : 1);
  e.train_accuracy = static_cast<double>(p.epoch_correct) / std::max<int64_t>(predictions, 1);
  e.train_seconds = p.epoch_seconds;
  e.samples_per_sec = p.epoch_samples / std::max(p.epoch_seconds, 1e-9);
  e.lr = lr;
  // The epoch is complete: the position now points at the start of the next one.
  p.epochs_done = epoch;
  p.step_in_epoch = 0;
  p.epoch_rng = next_epoch_rng;
  p.epoch_loss_sum = 0;
  p.epoch_correct = p.epoch_samples = 0;
  p.epoch_seconds = 0;
  if (dp_ != nullptr) KILN_RETURN_IF_ERROR(dp_->BroadcastBuffers());
  if (token_run()) {
    KILN_ASSIGN_OR_RETURN(e.test, EvaluateTokens());
  } else if (test_ != nullptr && test_->size > 0) {
    KILN_ASSIGN_OR_RETURN(e.test, Evaluate(*test_));
  }
  if (callbacks.on_epoch) callbacks.on_epoch(e);
  if (callbacks.after_step) KILN_RETURN_IF_ERROR(callbacks.after_step(*this));
  return absl::OkStatus();
}

absl::StatusOr<EvalResult> Trainer::Evaluate(const Dataset& data) {
  if (token_run()) {
    return absl::FailedPreconditionError(
        "a token run evaluates its validation split: EvaluateTokens");
  }
  Tensor pixels = test_pixels_, labels = test_labels_, index = eval_index_;
  if (&data != test_) {
    // Another dataset: upload it for this evaluation only.
    KILN_RETURN_IF_ERROR(CheckData(data, "evaluation", config_.model));
    KILN_RETURN_IF_ERROR(Upload(data, &pixels, &labels, &index));
  }
  EvalResult r;
  double loss_sum = 0;
  int64_t correct = 0;
  // Data-parallel, each rank evaluates its shard with rank 0's running statistics.
  if (dp_ != nullptr) KILN_RETURN_IF_ERROR(dp_->BroadcastBuffers());
  const BatchSlice shard = dp_ != nullptr ? dp_->Slice(data.size) : BatchSlice{0, data.size};
  const int64_t end = shard.offset + shard.count;
  for (int64_t start = shard.offset; start < end; start += kEvalBatchSize) {
    const int count = static_cast<int>(std::min<int64_t>(kEvalBatchSize, end - start));
    KILN_RETURN_IF_ERROR(
        LoadBatch(pixels, labels, data.sample_elems(), index.i32() + start, count));
    KILN_ASSIGN_OR_RETURN(const StepScalars scalars, EvalBatch());
    loss_sum += static_cast<double>(scalars.loss) * count;
    correct += scalars.correct;
  }
  KILN_RETURN_IF_ERROR(SumOverRanks(&loss_sum, &correct));
  r.samples = data.size;
  r.loss = loss_sum / std::max<int64_t>(data.size, 1);
  r.accuracy = static_cast<double>(correct) / std::max<int64_t>(data.size, 1);
  return r;
}

absl::StatusOr<Trainer::StepScalars> Trainer::EvalBatch() {
  KILN_ASSIGN_OR_RETURN(const Tensor* out, model_->Forward(batch_x_, Mode::kEval));
  KILN_RETURN_IF_ERROR(loss_->Compute(*out, batch_y_, step_scalars_.f32(), CorrectSlot(), nullptr));
  return ReadStepScalars();
}

absl::Status Trainer::SumOverRanks(double* loss_sum, int64_t* correct) {
  if (dp_ == nullptr) return absl::OkStatus();
  // Float sums: counts are exact below 2^24, the loss to float precision.
  float sums[2] = {static_cast<float>(*loss_sum), static_cast<float>(*correct)};
  KILN_RETURN_IF_ERROR(dp_->AllreduceHost(sums, 2));
  *loss_sum = sums[0];
  *correct = static_cast<int64_t>(sums[1]);
  return absl::OkStatus();
}

absl::StatusOr<EvalResult> Trainer::EvaluateTokens() {
  EvalResult r;
  if (!token_run() || tokens_->val.tokens() == 0) return r;
  const int bs = config_.batch_size;
  const int64_t t = config_.model.input_shape[0];
  if (dp_ != nullptr) KILN_RETURN_IF_ERROR(dp_->BroadcastBuffers());
  const BatchSlice mine = dp_ != nullptr ? dp_->Slice(bs) : BatchSlice{0, bs};
  double loss_sum = 0;
  int64_t correct = 0;
  for (int b = 0; b < config_.eval_iters; ++b) {
    KILN_RETURN_IF_ERROR(
        LoadTokenBatch(true, static_cast<uint64_t>(b), mine.offset, static_cast<int>(mine.count)));
    KILN_ASSIGN_OR_RETURN(const StepScalars scalars, EvalBatch());
    loss_sum += static_cast<double>(scalars.loss) * mine.count;
    correct += scalars.correct;
  }
  KILN_RETURN_IF_ERROR(SumOverRanks(&loss_sum, &correct));
  const int64_t windows = int64_t{config_.eval_iters} * bs;
  r.samples = windows;
  r.loss = loss_sum / windows;  // each batch's loss is a mean over its windows' positions
  r.accuracy = static_cast<double>(correct) / static_cast<double>(windows * t);
  return r;
}

absl::Status Trainer::SaveCheckpoint(const std::string& path) {
  if (!writes_checkpoints()) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank(), " does not write checkpoints: rank 0 does, for every rank"));
  }
  // The normalisation travels with the weights, so a served model applies it by itself.
  // A character model carries its vocabulary, so serving can turn text into ids and back.
  const std::string vocabulary = token_run() && tokens_->vocabulary.has_value()
                                     ? tokens_->vocabulary->ToJson()
                                     : std::string();
  return WriteCheckpoint(path, *model_, optimizer_.get(), position_, config_.norm, vocabulary);
}

absl::Status Trainer::LoadCheckpoint(const std::string& path) {
  return ReadCheckpoint(path, *model_, optimizer_.get(), &position_);
}

int32_t* Trainer::CorrectSlot() { return reinterpret_cast<int32_t*>(step_scalars_.f32() + 1); }

absl::StatusOr<Trainer::StepScalars> Trainer::ReadStepScalars() {
  StepScalars out;
  KILN_RETURN_IF_ERROR(backend_->CopyToHost(step_scalars_, &out, sizeof(out)));
  return out;
}

}  // namespace kiln
