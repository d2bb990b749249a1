#include "client/spec_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli_status.h"
#include "client/plain_enum_names.h"
#include "common/json_bounds.h"
#include "common/status_macros.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"

namespace kiln::client {
namespace {

// Collects the text-format parser's complaints with their positions.
class CollectErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (!text.empty()) text.append("; ");
    absl::StrAppend(&text, "line ", line + 1, " column ", column + 1, ": ", message);
  }
  std::string text;
};

}  // namespace

absl::StatusOr<v1::JobSpec> ParseSpecJson(const std::string& text, const std::string& source) {
  v1::JobSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  // Plain enum names ("adamw") become full ones ("KIND_ADAMW") before protobuf's parser, which
  // knows only those. Text that is not JSON goes to it unchanged, for its error message.
  std::string expanded = text;
  if (absl::Status depth = CheckJsonDepth(text, source); !depth.ok()) {
    return UsageError(std::string(depth.message()));
  }
  nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!json.is_discarded()) {
    absl::Status names = ExpandPlainEnumNames(v1::JobSpec::descriptor(), "spec", &json);
    if (!names.ok()) return UsageError(absl::StrCat(source, ": ", names.message()));
    expanded = json.dump();
  }
  auto status = google::protobuf::util::JsonStringToMessage(expanded, &spec, options);
  if (!status.ok()) {
    return UsageError(
        absl::StrCat(source, ": not a valid JobSpec in JSON: ", std::string(status.message())));
  }
  return spec;
}

absl::StatusOr<v1::JobSpec> ParseSpecText(const std::string& text, const std::string& source) {
  v1::JobSpec spec;
  google::protobuf::TextFormat::Parser parser;
  CollectErrors errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &spec)) {
    return UsageError(absl::StrCat(source, ": not a valid JobSpec in text format: ", errors.text));
  }
  return spec;
}

absl::StatusOr<v1::JobSpec> ReadSpecFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return UsageError(absl::StrCat("cannot read spec file ", path));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  const std::string lower = absl::AsciiStrToLower(path);
  if (absl::EndsWith(lower, ".json")) return ParseSpecJson(text, path);
  for (const char* ext : {".textproto", ".txtpb", ".pbtxt", ".prototxt", ".txt"}) {
    if (absl::EndsWith(lower, ext)) return ParseSpecText(text, path);
  }
  const absl::string_view stripped = absl::StripLeadingAsciiWhitespace(text);
  if (absl::StartsWith(stripped, "{")) return ParseSpecJson(text, path);
  return ParseSpecText(text, path);
}

namespace {

absl::Status ApplyOptimizerFlags(const SpecOverrides& o, v1::JobSpec* spec) {
  const bool tweaks = o.lr.has_value() || o.momentum.has_value() || o.weight_decay.has_value();
  if (o.optimizer.empty() && !tweaks) return absl::OkStatus();
  v1::OptimizerSpec* opt = spec->mutable_optimizer();
  if (opt->kind() == v1::OptimizerSpec::KIND_UNSPECIFIED && !spec->preset().empty()) {
    absl::StatusOr<v1::OptimizerSpec> preset = PresetOptimizer(spec->preset());
    if (preset.ok()) *opt = *std::move(preset);
  }
  if (!o.optimizer.empty()) {
    KILN_ASSIGN_OR_RETURN(
        const google::protobuf::EnumValueDescriptor* kind,
        ParsePlainEnumName(v1::OptimizerSpec::Kind_descriptor(), o.optimizer, "--optimizer"));
    if (kind->number() == v1::OptimizerSpec::KIND_UNSPECIFIED) {
      return UsageError("--optimizer: expected sgd, adam or adamw");
    }
    if (kind->number() != opt->kind()) {
      // Another rule: its own fields (momentum, betas) do not carry over.
      v1::OptimizerSpec fresh;
      fresh.set_kind(static_cast<v1::OptimizerSpec::Kind>(kind->number()));
      fresh.set_lr(opt->lr() > 0 ? opt->lr() : 0.001f);
      fresh.set_weight_decay(opt->weight_decay());
      *opt = fresh;
    }
  } else if (opt->kind() == v1::OptimizerSpec::KIND_UNSPECIFIED) {
    return UsageError(
        "--lr, --momentum and --weight-decay need an optimizer: give --optimizer, a spec with "
        "an optimizer.kind, or a preset");
  }
  if (o.lr.has_value()) opt->set_lr(static_cast<float>(*o.lr));
  if (o.momentum.has_value()) opt->set_momentum(static_cast<float>(*o.momentum));
  if (o.weight_decay.has_value()) opt->set_weight_decay(static_cast<float>(*o.weight_decay));
  return absl::OkStatus();
}

absl::Status ApplyPrecisionFlag(const std::string& flag, v1::JobSpec* spec) {
  if (flag.empty()) return absl::OkStatus();
  KILN_ASSIGN_OR_RETURN(v1::Precision precision, ParsePrecisionFlag(flag, "--precision"));
  spec->set_precision(precision);
  return absl::OkStatus();
}

absl::Status ApplyPriorityFlag(const std::string& flag, v1::JobSpec* spec) {
  if (flag.empty()) return absl::OkStatus();
  KILN_ASSIGN_OR_RETURN(const google::protobuf::EnumValueDescriptor* priority,
                        ParsePlainEnumName(v1::Priority_descriptor(), flag, "--priority"));
  if (priority->number() == v1::PRIORITY_UNSPECIFIED) {
    return UsageError("--priority: expected low, normal or high");
  }
  spec->set_priority(static_cast<v1::Priority>(priority->number()));
  return absl::OkStatus();
}

absl::Status ApplyLabels(const std::vector<std::string>& labels, v1::JobSpec* spec) {
  for (const std::string& label : labels) {
    const size_t eq = label.find('=');
    if (eq == std::string::npos || eq == 0) {
      return UsageError(absl::StrCat("--label \"", label, "\": expected KEY=VALUE"));
    }
    (*spec->mutable_labels())[label.substr(0, eq)] = label.substr(eq + 1);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::OptimizerSpec> PresetOptimizer(const std::string& preset) {
  v1::OptimizerSpec opt;
  if (preset == "mnist-mlp") {
    opt.set_kind(v1::OptimizerSpec::KIND_SGD);
    opt.set_lr(0.001f);
    opt.set_momentum(0.9f);
  } else if (preset == "mnist-cnn") {
    opt.set_kind(v1::OptimizerSpec::KIND_ADAM);
    opt.set_lr(0.001f);
  } else {
    return absl::NotFoundError(absl::StrCat("no preset \"", preset, "\""));
  }
  return opt;
}

absl::StatusOr<v1::Precision> ParsePrecisionFlag(const std::string& text, const std::string& flag) {
  KILN_ASSIGN_OR_RETURN(const google::protobuf::EnumValueDescriptor* precision,
                        ParsePlainEnumName(v1::Precision_descriptor(), text, flag));
  if (precision->number() == v1::PRECISION_UNSPECIFIED) {
    return UsageError(absl::StrCat(flag, ": expected fp32, tf32 or bf16"));
  }
  return static_cast<v1::Precision>(precision->number());
}

std::string PriorityWord(v1::Priority priority) {
  if (priority == v1::PRIORITY_UNSPECIFIED) priority = v1::PRIORITY_NORMAL;
  return PlainEnumName(v1::Priority_descriptor()->FindValueByNumber(priority));
}

std::string PrecisionWord(v1::Precision precision) {
  if (precision == v1::PRECISION_UNSPECIFIED) precision = v1::PRECISION_FP32;
  return PlainEnumName(v1::Precision_descriptor()->FindValueByNumber(precision));
}

absl::StatusOr<v1::ScheduleSpec> ParseScheduleFlag(const std::string& text) {
  const size_t colon = text.find(':');
  // Built as the JSON form, so ScheduleSpec's own field names, types and enum names apply.
  nlohmann::json json = {{"kind", text.substr(0, colon)}};
  if (colon != std::string::npos) {
    for (absl::string_view pair : absl::StrSplit(text.substr(colon + 1), ',', absl::SkipEmpty())) {
      const size_t eq = pair.find('=');
      if (eq == absl::string_view::npos || eq == 0) {
        return UsageError(absl::StrCat("--schedule: \"", pair, "\" is not FIELD=VALUE"));
      }
      const std::string key(pair.substr(0, eq)), value(pair.substr(eq + 1));
      int64_t integer = 0;
      double number = 0;
      if (value == "true" || value == "false") {
        json[key] = value == "true";
      } else if (absl::SimpleAtoi(value, &integer)) {
        json[key] = integer;  // "2.0" would not do for an int64 field
      } else if (absl::SimpleAtod(value, &number)) {
        json[key] = number;
      } else {
        json[key] = value;
      }
    }
  }
  absl::Status names = ExpandPlainEnumNames(v1::ScheduleSpec::descriptor(), "--schedule", &json);
  if (!names.ok()) return UsageError(names.message());
  v1::ScheduleSpec schedule;
  auto status = google::protobuf::util::JsonStringToMessage(json.dump(), &schedule);
  if (!status.ok()) {
    return UsageError(absl::StrCat("--schedule \"", text, "\": ", std::string(status.message()),
                                   " (fields: see ScheduleSpec in model_spec.proto)"));
  }
  return schedule;
}

absl::Status ApplyOverrides(const SpecOverrides& o, v1::JobSpec* spec) {
  if (!o.preset.empty()) spec->set_preset(o.preset);
  if (!o.dataset.empty()) spec->set_dataset(o.dataset);
  if (spec->dataset().empty()) spec->set_dataset("mnist");
  if (o.epochs.has_value()) spec->set_epochs(*o.epochs);
  if (o.max_iters.has_value()) spec->set_max_iters(*o.max_iters);
  if (o.eval_interval.has_value()) spec->set_eval_interval(*o.eval_interval);
  // A language model's run is counted in iterations (max_iters), a classifier's in epochs.
  if (spec->epochs() == 0 && spec->max_iters() == 0) spec->set_epochs(1);
  if (o.batch_size.has_value()) spec->set_batch_size(*o.batch_size);
  if (!o.device.empty()) spec->set_device(o.device);
  if (o.seed.has_value()) spec->set_seed(*o.seed);
  KILN_RETURN_IF_ERROR(ApplyOptimizerFlags(o, spec));
  if (!o.schedule.empty()) {
    KILN_ASSIGN_OR_RETURN(*spec->mutable_schedule(), ParseScheduleFlag(o.schedule));
  }
  if (!o.name.empty()) spec->set_name(o.name);
  if (o.workers.has_value()) spec->set_workers(*o.workers);
  if (o.max_retries.has_value()) spec->set_max_retries(*o.max_retries);
  if (o.external_workers) spec->set_external_workers(true);
  KILN_RETURN_IF_ERROR(ApplyPrecisionFlag(o.precision, spec));
  KILN_RETURN_IF_ERROR(ApplyPriorityFlag(o.priority, spec));
  if (o.non_preemptible) spec->set_non_preemptible(true);
  return ApplyLabels(o.labels, spec);
}

}  // namespace kiln::client
