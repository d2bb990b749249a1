// Job specs from files (SPEC.json in the proto3 JSON mapping, SPEC.textproto in text format) and
// the command-line overrides of `kiln submit`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kiln/v1/model_spec.pb.h"

namespace kiln::client {

// Reads a JobSpec from `path`: *.json as JSON, *.textproto/*.txtpb/*.pbtxt/*.prototxt as text
// format, anything else by its first non-blank character ('{' means JSON). Parse errors are
// InvalidArgument naming the file and, where the parser says, the line.
absl::StatusOr<v1::JobSpec> ReadSpecFile(const std::string& path);
// Parses spec text in the given syntax; `source` names it in errors.
absl::StatusOr<v1::JobSpec> ParseSpecJson(const std::string& text, const std::string& source);
absl::StatusOr<v1::JobSpec> ParseSpecText(const std::string& text, const std::string& source);

// Flags of `kiln submit` that change the spec; unset ones leave it alone.
struct SpecOverrides {
  std::string preset;
  std::string dataset;
  std::optional<int> epochs;
  std::optional<int64_t> max_iters;     // a language model's run
  std::optional<int> eval_interval;
  std::optional<int> batch_size;
  std::string optimizer;  // a plain or full OptimizerSpec.Kind name: "adamw"
  std::optional<double> lr;
  std::optional<double> momentum;
  std::optional<double> weight_decay;
  std::string schedule;  // KIND[:FIELD=VALUE,...], e.g. "step:step_size=2,gamma=0.5"
  std::string device;
  std::optional<uint64_t> seed;
  std::string name;
  std::vector<std::string> labels;  // KEY=VALUE each
  std::optional<int> workers;       // data-parallel ranks
  std::optional<int> max_retries;
  bool external_workers = false;
  std::string precision;  // a plain or full Precision name: "tf32", "bf16"
  std::string priority;   // a plain or full Priority name: "low", "normal", "high"
  bool non_preemptible = false;
};

// Applies `o` to `spec`. The dataset defaults to "mnist" and the epochs to 1 when neither the
// spec nor the flags give them (nor max_iters, a language model's run). An optimizer flag on a preset without an explicit optimizer first
// spells out the preset's optimizer (kilnd takes a partial optimizer as a whole one), so only
// what the flags say changes. --optimizer naming another kind starts a fresh optimizer of that
// kind that keeps the rate and weight decay (the rate defaults to 1e-3, PyTorch's). --schedule
// replaces the schedule. --label adds to the spec's labels. Bad values are usage errors.
absl::Status ApplyOverrides(const SpecOverrides& o, v1::JobSpec* spec);

// The optimizer a preset ("mnist-mlp", "mnist-cnn") sets, as model_spec.proto documents it, for
// optimizer flags to apply to before the job exists. Everything else a preset sets the client
// learns from kilnd (Job.resolved_spec); a test checks this copy against it. NotFound for any
// other name.
absl::StatusOr<v1::OptimizerSpec> PresetOptimizer(const std::string& preset);

// A --precision flag's value (`flag` names it in errors): "fp32", "tf32" or "bf16", in any case,
// or the full name ("PRECISION_BF16"); a usage error otherwise. The client's one reading of a
// precision word, for jobs (JobSpec.precision) and deployments (the "precision" load parameter,
// sent as PrecisionWord spells it).
absl::StatusOr<v1::Precision> ParsePrecisionFlag(const std::string& text, const std::string& flag);

// "fp32", "tf32" or "bf16": how kiln and kilnd spell `precision` (unset is fp32).
std::string PrecisionWord(v1::Precision precision);
// "low", "normal" or "high": how kiln spells `priority` (unset is normal).
std::string PriorityWord(v1::Priority priority);

// Parses a --schedule value: a ScheduleSpec kind ("cosine", "one_cycle"), optionally followed by
// ':' and comma-separated FIELD=VALUE pairs of ScheduleSpec's fields ("t_max=10,eta_min=1e-5").
absl::StatusOr<v1::ScheduleSpec> ParseScheduleFlag(const std::string& text);

}  // namespace kiln::client
