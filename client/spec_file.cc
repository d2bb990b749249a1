#include "client/spec_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cli_status.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"

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
  auto status = google::protobuf::util::JsonStringToMessage(text, &spec, options);
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

absl::Status ApplyOverrides(const SpecOverrides& o, v1::JobSpec* spec) {
  if (!o.preset.empty()) spec->set_preset(o.preset);
  if (!o.dataset.empty()) spec->set_dataset(o.dataset);
  if (spec->dataset().empty()) spec->set_dataset("mnist");
  if (o.epochs.has_value()) spec->set_epochs(*o.epochs);
  if (spec->epochs() == 0) spec->set_epochs(1);
  if (o.batch_size.has_value()) spec->set_batch_size(*o.batch_size);
  if (!o.device.empty()) spec->set_device(o.device);
  if (o.seed.has_value()) spec->set_seed(*o.seed);
  if (o.lr.has_value()) {
    v1::OptimizerSpec* opt = spec->mutable_optimizer();
    if (opt->kind() == v1::OptimizerSpec::KIND_UNSPECIFIED) {
      // The presets' optimizers, as training.proto documents them.
      if (spec->preset() == "mnist-mlp") {
        opt->set_kind(v1::OptimizerSpec::KIND_SGD);
        opt->set_momentum(0.9f);
      } else if (spec->preset() == "mnist-cnn") {
        opt->set_kind(v1::OptimizerSpec::KIND_ADAM);
      } else {
        return UsageError("--lr needs an optimizer: give the spec an optimizer.kind or a preset");
      }
    }
    opt->set_lr(static_cast<float>(*o.lr));
  }
  return absl::OkStatus();
}

}  // namespace kiln::client
