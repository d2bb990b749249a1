// Renders a job's event stream: a live progress bar on a terminal, or plain lines (no control
// characters) when the output is not one; a line per finished epoch and a final summary.
#pragma once

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kiln/v1/training.pb.h"

namespace kiln::client {

class ProgressView {
 public:
  enum class Style {
    kLive,   // one bar redrawn in place with "\r" and ANSI erase-line, at most 10 times a second
    kPlain,  // lines only: state changes, each tenth of an epoch, epochs, checkpoints
  };

  // `job` is the job as GetJob returned it before watching (for its epoch count); `width` is
  // the terminal's width in columns (kLive only).
  ProgressView(std::FILE* out, Style style, const v1::Job& job, int width = 100);

  // Shows one event of the WatchJob stream.
  void OnEvent(const v1::JobEvent& event);
  // Prints the closing summary of `job`, the job after its stream ended.
  void PrintSummary(const v1::Job& job);
  // Removes the live bar so that other text can follow on a clean line. Thread-safe.
  void ClearLine();

  // The line of one finished epoch, e.g. "epoch 1/3  train loss 0.3456 ...", or for a language
  // model's run (max_iters > 0) of one evaluation interval, "iter 250/2000  train loss 2.1 ...
  // val loss 2.0  val ppl 7.39 ...".
  static std::string EpochLine(const v1::EpochMetrics& e, int total_epochs, int64_t max_iters = 0,
                               int64_t eval_interval = 0);

 private:
  void OnStep(const v1::StepMetrics& step, absl::Time at);
  void PrintLineLocked(const std::string& line);
  std::string BarLine(int width) const;
  std::string StepLine() const;
  void ClearLineLocked();

  std::mutex mu_;
  std::FILE* out_;
  const Style style_;
  const int width_;
  const std::string job_id_;
  int total_epochs_;
  // A language model's run: counted in iterations, scored by validation loss and perplexity.
  const int64_t max_iters_;
  const int64_t eval_interval_;

  // The latest step and what the bar needs around it.
  v1::StepMetrics step_;
  bool have_step_ = false;
  double smoothed_loss_ = 0;
  absl::Time epoch_start_ = absl::InfinitePast();
  absl::Time rate_start_ = absl::InfinitePast();  // first step seen of this attempt
  int64_t rate_start_step_ = 0;
  absl::Time last_step_time_ = absl::InfinitePast();
  double seconds_per_step_ = 0;
  double last_test_accuracy_ = -1;  // < 0 before the first epoch
  double last_test_loss_ = -1;      // likewise; a language model's bar shows its perplexity
  int printed_tenth_ = -1;          // kPlain: the last tenth of the epoch printed
  int printed_tenth_epoch_ = 0;

  bool bar_visible_ = false;
  absl::Time last_draw_ = absl::InfinitePast();
};

}  // namespace kiln::client
