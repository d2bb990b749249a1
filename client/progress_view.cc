#include "client/progress_view.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/format.h"
#include "common/byte_size.h"

namespace kiln::client {
namespace {

constexpr absl::Duration kRedrawInterval = absl::Milliseconds(100);

std::string Plural(int64_t n, const char* word) {
  return absl::StrCat(n, " ", word, n == 1 ? "" : "s");
}

}  // namespace

ProgressView::ProgressView(std::FILE* out, Style style, const v1::Job& job, int width)
    : out_(out),
      style_(style),
      width_(std::max(40, width)),
      job_id_(job.id()),
      total_epochs_(job.epochs()),
      max_iters_(job.spec().max_iters()),
      eval_interval_(job.spec().eval_interval()) {}  // kilnd stores the one it uses

std::string ProgressView::EpochLine(const v1::EpochMetrics& e, int total_epochs, int64_t max_iters,
                                    int64_t eval_interval) {
  if (max_iters > 0) {
    std::string line = absl::StrFormat("iter %d/%d  train loss %.4f",
                                       std::min(int64_t{e.epoch()} * eval_interval, max_iters),
                                       max_iters, e.train_loss());
    if (e.test_samples() > 0) {
      absl::StrAppendFormat(&line, "  val loss %.4f  val ppl %.2f  next-token acc %s",
                            e.test_loss(), std::exp(e.test_loss()),
                            FormatPercent(e.test_accuracy()));
    }
    absl::StrAppendFormat(&line, "  %s  %.0f windows/s",
                          DurationText(absl::Seconds(e.train_seconds())), e.samples_per_sec());
    return line;
  }
  std::string line =
      absl::StrFormat("epoch %d/%d  train loss %.4f  train acc %s", e.epoch(), total_epochs,
                      e.train_loss(), FormatPercent(e.train_accuracy()));
  if (e.test_samples() > 0) {
    absl::StrAppendFormat(&line, "  test loss %.4f  test acc %s", e.test_loss(),
                          FormatPercent(e.test_accuracy()));
  }
  absl::StrAppendFormat(&line, "  %s  %.0f samples/s",
                        DurationText(absl::Seconds(e.train_seconds())), e.samples_per_sec());
  return line;
}

void ProgressView::ClearLine() {
  std::lock_guard<std::mutex> lock(mu_);
  ClearLineLocked();
}

void ProgressView::ClearLineLocked() {
  if (!bar_visible_) return;
  std::fputs("\r\033[K", out_);
  std::fflush(out_);
  bar_visible_ = false;
}

void ProgressView::PrintLineLocked(const std::string& line) {
  ClearLineLocked();
  std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

void ProgressView::OnEvent(const v1::JobEvent& event) {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time at = ToAbslTime(event.time());
  switch (event.event_case()) {
    case v1::JobEvent::kState: {
      const v1::StateChange& s = event.state();
      if (s.state() == v1::JOB_STATE_RUNNING) {
        epoch_start_ = at;
        rate_start_ = absl::InfinitePast();
        have_step_ = false;
      }
      // Final states are told by the summary.
      if (s.state() == v1::JOB_STATE_SUCCEEDED || s.state() == v1::JOB_STATE_FAILED ||
          s.state() == v1::JOB_STATE_CANCELLED) {
        return;
      }
      std::string line = absl::StrCat(job_id_, ": ", StateName(s.state()));
      if (!s.reason().empty()) absl::StrAppend(&line, " (", s.reason(), ")");
      PrintLineLocked(line);
      return;
    }
    case v1::JobEvent::kStep:
      OnStep(event.step(), at);
      return;
    case v1::JobEvent::kEpoch: {
      const v1::EpochMetrics& e = event.epoch();
      if (e.test_samples() > 0) {
        last_test_accuracy_ = e.test_accuracy();
        last_test_loss_ = e.test_loss();
      }
      total_epochs_ = std::max(total_epochs_, e.epoch());
      epoch_start_ = at;
      PrintLineLocked(EpochLine(e, total_epochs_, max_iters_, eval_interval_));
      return;
    }
    case v1::JobEvent::kCheckpoint: {
      const v1::Checkpoint& c = event.checkpoint();
      PrintLineLocked(absl::StrFormat("checkpoint %d (%s): epoch %d, step %d, %s", c.id(),
                                      CheckpointKindName(c.kind()), c.epochs_done(),
                                      c.global_step(), FormatBytes(c.size_bytes())));
      return;
    }
    case v1::JobEvent::EVENT_NOT_SET:
      return;
  }
}

void ProgressView::OnStep(const v1::StepMetrics& step, absl::Time at) {
  const bool new_epoch = !have_step_ || step.epoch() != step_.epoch();
  if (rate_start_ == absl::InfinitePast()) {
    rate_start_ = at;
    rate_start_step_ = step.global_step();
  } else if (step.global_step() > rate_start_step_) {
    seconds_per_step_ = absl::ToDoubleSeconds(at - rate_start_) /
                        static_cast<double>(step.global_step() - rate_start_step_);
  }
  smoothed_loss_ = new_epoch ? step.loss() : 0.9 * smoothed_loss_ + 0.1 * step.loss();
  step_ = step;
  have_step_ = true;
  last_step_time_ = at;
  total_epochs_ = std::max(total_epochs_, step.epoch());
  const bool last_of_epoch = step.step_in_epoch() >= step.steps_per_epoch();

  if (style_ == Style::kPlain) {
    const int spe = std::max(1, step.steps_per_epoch());
    const int tenth = static_cast<int>(int64_t{step.step_in_epoch()} * 10 / spe);
    if (step.epoch() != printed_tenth_epoch_) {
      printed_tenth_epoch_ = step.epoch();
      printed_tenth_ = 0;
    }
    // Each tenth of the epoch gets one line; the epoch line covers the end.
    if (tenth > printed_tenth_ && !last_of_epoch) {
      printed_tenth_ = tenth;
      PrintLineLocked(StepLine());
    }
    return;
  }
  const absl::Time now = absl::Now();
  if (!last_of_epoch && now - last_draw_ < kRedrawInterval) return;
  last_draw_ = now;
  std::fprintf(out_, "\r\033[K%s", BarLine(width_ - 1).c_str());
  std::fflush(out_);
  bar_visible_ = true;
}

std::string ProgressView::StepLine() const {
  const absl::Duration elapsed = last_step_time_ - epoch_start_;
  const int remaining = std::max(0, step_.steps_per_epoch() - step_.step_in_epoch());
  const absl::Duration eta = absl::Seconds(seconds_per_step_ * remaining);
  std::string line = absl::StrFormat(
      "epoch %d/%d  step %d/%d (%d%%)  loss %.4f  %.0f samples/s  elapsed %s  eta %s",
      step_.epoch(), total_epochs_, step_.step_in_epoch(), step_.steps_per_epoch(),
      static_cast<int>(100LL * step_.step_in_epoch() / std::max(1, step_.steps_per_epoch())),
      smoothed_loss_, step_.samples_per_sec(),
      FormatClock(epoch_start_ == absl::InfinitePast() ? absl::ZeroDuration() : elapsed),
      seconds_per_step_ > 0 ? FormatClock(eta) : std::string("--:--"));
  return line;
}

std::string ProgressView::BarLine(int width) const {
  const int spe = std::max(1, step_.steps_per_epoch());
  const double fraction = std::min(1.0, static_cast<double>(step_.step_in_epoch()) / spe);
  const absl::Duration elapsed =
      epoch_start_ == absl::InfinitePast() ? absl::ZeroDuration() : last_step_time_ - epoch_start_;
  const int remaining = std::max(0, spe - step_.step_in_epoch());
  const std::string eta =
      seconds_per_step_ > 0 ? FormatClock(absl::Seconds(seconds_per_step_ * remaining)) : "--:--";
  // A language model's bar counts iterations and shows the last validation perplexity.
  const bool lm = max_iters_ > 0;
  const std::string head = lm ? absl::StrFormat("iter %d/%d ", step_.global_step(), max_iters_)
                              : absl::StrFormat("epoch %d/%d ", step_.epoch(), total_epochs_);
  const std::string score =
      lm ? absl::StrCat("val ppl ", last_test_loss_ < 0
                                        ? std::string("-")
                                        : absl::StrFormat("%.2f", std::exp(last_test_loss_)))
         : absl::StrCat("acc ", last_test_accuracy_ < 0 ? std::string("-")
                                                        : FormatPercent(last_test_accuracy_));
  const std::string tail =
      absl::StrFormat(" %d/%d  loss %.4f  %s  %.0f/s  %s eta %s", step_.step_in_epoch(), spe,
                      smoothed_loss_, score, step_.samples_per_sec(), FormatClock(elapsed), eta);
  // The bar takes what the text leaves, between 10 and 30 cells.
  const int room = width - static_cast<int>(head.size() + tail.size()) - 2;
  const int cells = std::clamp(room, 10, 30);
  const int filled = static_cast<int>(std::lround(fraction * cells));
  std::string bar = "[";
  for (int i = 0; i < cells; ++i) bar.push_back(i < filled ? '=' : (i == filled ? '>' : ' '));
  bar.push_back(']');
  std::string line = head + bar + tail;
  if (static_cast<int>(line.size()) > width) line.resize(std::max(0, width));
  return line;
}

void ProgressView::PrintSummary(const v1::Job& job) {
  std::lock_guard<std::mutex> lock(mu_);
  ClearLineLocked();
  absl::Duration took = absl::ZeroDuration();
  if (job.has_start_time() && job.has_end_time()) {
    took = ToAbslTime(job.end_time()) - ToAbslTime(job.start_time());
  }
  std::string line = absl::StrCat(job.id(), " ", StateName(job.state()));
  switch (job.state()) {
    case v1::JOB_STATE_SUCCEEDED:
      absl::StrAppend(&line, ": ", Plural(job.epochs_done(), "epoch"), ", ",
                      Plural(job.global_step(), "step"), " in ", DurationText(took));
      if (job.last_epoch().test_samples() > 0 && max_iters_ > 0) {
        absl::StrAppendFormat(&line, "; validation loss %.4f (perplexity %.2f)",
                              job.last_epoch().test_loss(), std::exp(job.last_epoch().test_loss()));
      } else if (job.last_epoch().test_samples() > 0) {
        absl::StrAppend(&line, "; test accuracy ", FormatPercent(job.last_epoch().test_accuracy()),
                        " (best ", FormatPercent(job.best_test_accuracy()), ")");
      }
      PrintLineLocked(line);
      PrintLineLocked(absl::StrCat("next: kiln deploy ", job.id(), "   or   kiln export ", job.id(),
                                   " -o model.safetensors"));
      return;
    case v1::JOB_STATE_FAILED:
    case v1::JOB_STATE_CANCELLED:
      absl::StrAppend(&line, " after ", Plural(job.epochs_done(), "epoch"), ", ",
                      Plural(job.global_step(), "step"));
      if (!job.reason().empty()) absl::StrAppend(&line, ": ", job.reason());
      PrintLineLocked(line);
      if (job.state() == v1::JOB_STATE_CANCELLED || job.global_step() > 0) {
        PrintLineLocked(absl::StrCat("resume it with: kiln resume ", job.id()));
      }
      return;
    default:
      if (!job.reason().empty()) absl::StrAppend(&line, " (", job.reason(), ")");
      PrintLineLocked(line);
      return;
  }
}

}  // namespace kiln::client
