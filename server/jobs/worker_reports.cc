#include "server/jobs/worker_reports.h"

#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kiln::server {
namespace {

absl::Status Outside(int rank, const char* field, int64_t value, int64_t lo, int64_t hi,
                     const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("rank ", rank, ": ", field, " ", value,
                                                 " is outside ", lo, "..", hi, " (", why, ")"));
}

// A count, a time or a rate: finite and not negative.
absl::Status NonNegative(int rank, const char* field, double value) {
  if (std::isfinite(value) && value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("rank ", rank, ": ", field, " ", value, " must be finite and not negative"));
}

absl::Status Fraction(int rank, const char* field, double value) {
  if (value >= 0 && value <= 1) return absl::OkStatus();  // false for NaN
  return absl::InvalidArgumentError(
      absl::StrCat("rank ", rank, ": ", field, " ", value, " is outside [0, 1]"));
}

// The engine's words for a loss that stopped being finite (Trainer::Train), with the rank.
std::string LossBecame(int rank, double loss) {
  return absl::StrCat("rank ", rank, ": loss became ", std::isnan(loss) ? "NaN" : "Inf");
}

}  // namespace

int64_t StepsPerEpoch(int64_t train_samples, int batch_size) {
  return train_samples / batch_size + (train_samples % batch_size != 0 ? 1 : 0);
}

WorkerReportCheck::WorkerReportCheck(const WorkerPlan& plan)
    : plan_(plan),
      last_global_step_(plan.epochs > 0 && plan.steps_per_epoch >
                                               std::numeric_limits<int64_t>::max() / plan.epochs
                            ? std::numeric_limits<int64_t>::max()
                            : plan.steps_per_epoch * plan.epochs),
      last_step_(plan.world_size, plan.start_global_step),
      last_epoch_(plan.world_size, plan.start_epochs_done) {}

absl::Status WorkerReportCheck::Check(int rank, const v1::WorkerReport& report) {
  if (report.has_step()) return CheckStep(rank, report.step());
  if (report.has_epoch()) return CheckEpoch(rank, report.epoch().metrics());
  return absl::OkStatus();
}

absl::Status WorkerReportCheck::CheckStep(int rank, const v1::WorkerStep& step) {
  const v1::StepMetrics& m = step.metrics();
  const std::string plan =
      absl::StrCat("the job's ", plan_.epochs, " epochs of ", plan_.steps_per_epoch, " steps");
  if (m.steps_per_epoch() != plan_.steps_per_epoch) {
    return Outside(rank, "step.metrics.steps_per_epoch", m.steps_per_epoch(), plan_.steps_per_epoch,
                   plan_.steps_per_epoch,
                   absl::StrCat("the job's dataset in batches of ", plan_.batch_size));
  }
  if (m.epoch() <= plan_.start_epochs_done || m.epoch() > plan_.epochs) {
    return Outside(rank, "step.metrics.epoch", m.epoch(), plan_.start_epochs_done + 1, plan_.epochs,
                   absl::StrCat(plan, ", from epoch ", plan_.start_epochs_done + 1, " on"));
  }
  if (m.step_in_epoch() < 1 || m.step_in_epoch() > plan_.steps_per_epoch) {
    return Outside(rank, "step.metrics.step_in_epoch", m.step_in_epoch(), 1, plan_.steps_per_epoch,
                   "the steps of an epoch");
  }
  if (m.global_step() <= plan_.start_global_step || m.global_step() > last_global_step_) {
    return Outside(
        rank, "step.metrics.global_step", m.global_step(), plan_.start_global_step + 1,
        last_global_step_,
        absl::StrCat(plan, ", this attempt starting after step ", plan_.start_global_step));
  }
  if (m.global_step() <= last_step_[rank]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, ": step.metrics.global_step ", m.global_step(),
        " does not come after its last step, ", last_step_[rank], " (steps move forward)"));
  }
  if (!std::isfinite(m.loss())) {
    return absl::FailedPreconditionError(absl::StrCat(LossBecame(rank, m.loss()), " at epoch ",
                                                      m.epoch(), " step ", m.step_in_epoch()));
  }
  if (m.rank_samples_per_sec_size() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, ": step.metrics.rank_samples_per_sec is kilnd's to fill, not a worker's"));
  }
  KILN_RETURN_IF_ERROR(NonNegative(rank, "step.metrics.lr", m.lr()));
  KILN_RETURN_IF_ERROR(NonNegative(rank, "step.metrics.samples_per_sec", m.samples_per_sec()));
  if (step.samples() < 1 || step.samples() > plan_.batch_size) {
    return Outside(rank, "step.samples", step.samples(), 1, plan_.batch_size, "the job's batch");
  }
  if (step.rank_samples() < 0 || step.rank_samples() > step.samples()) {
    return Outside(rank, "step.rank_samples", step.rank_samples(), 0, step.samples(),
                   "the step's samples");
  }
  KILN_RETURN_IF_ERROR(NonNegative(rank, "step.seconds", step.seconds()));
  KILN_RETURN_IF_ERROR(NonNegative(rank, "step.allreduce_seconds", step.allreduce_seconds()));
  if (step.allreduce_bytes() < 0) {
    return Outside(rank, "step.allreduce_bytes", step.allreduce_bytes(), 0,
                   std::numeric_limits<int64_t>::max(), "a count of bytes");
  }
  last_step_[rank] = m.global_step();
  return absl::OkStatus();
}

absl::Status WorkerReportCheck::CheckEpoch(int rank, const v1::EpochMetrics& m) {
  if (m.epoch() <= plan_.start_epochs_done || m.epoch() > plan_.epochs) {
    return Outside(rank, "epoch.metrics.epoch", m.epoch(), plan_.start_epochs_done + 1,
                   plan_.epochs,
                   absl::StrCat("the job's ", plan_.epochs, " epochs, this attempt starting after ",
                                plan_.start_epochs_done));
  }
  if (m.epoch() <= last_epoch_[rank]) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": epoch.metrics.epoch ", m.epoch(),
                     " does not come after its last epoch, ", last_epoch_[rank]));
  }
  if (!std::isfinite(m.train_loss())) {
    return absl::FailedPreconditionError(absl::StrCat(
        LossBecame(rank, m.train_loss()), " in epoch ", m.epoch(), " (epoch.metrics.train_loss)"));
  }
  if (!std::isfinite(m.test_loss())) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, ": epoch.metrics.test_loss ",
                                                   m.test_loss(), " must be finite"));
  }
  KILN_RETURN_IF_ERROR(Fraction(rank, "epoch.metrics.train_accuracy", m.train_accuracy()));
  KILN_RETURN_IF_ERROR(Fraction(rank, "epoch.metrics.test_accuracy", m.test_accuracy()));
  if (m.test_samples() < 0 || m.test_samples() > plan_.test_samples) {
    return Outside(rank, "epoch.metrics.test_samples", m.test_samples(), 0, plan_.test_samples,
                   "the dataset's test split");
  }
  KILN_RETURN_IF_ERROR(NonNegative(rank, "epoch.metrics.train_seconds", m.train_seconds()));
  KILN_RETURN_IF_ERROR(NonNegative(rank, "epoch.metrics.samples_per_sec", m.samples_per_sec()));
  KILN_RETURN_IF_ERROR(NonNegative(rank, "epoch.metrics.lr", m.lr()));
  last_epoch_[rank] = m.epoch();
  return absl::OkStatus();
}

}  // namespace kiln::server
