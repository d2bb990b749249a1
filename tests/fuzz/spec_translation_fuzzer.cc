// Fuzzes SubmitJob's validation: a kiln.v1.JobSpec parsed from the bytes (inputs that do not
// parse are skipped) goes through TranslateSpec with kilnd's default limits.
//
// Oracle: a rejection is InvalidArgument or ResourceExhausted with a message naming a field
// ("spec...."); an accepted spec is one the engine can build: its shapes infer end to end to a
// vector of logits, and every number the limits bound is within them.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "engine/data/augment.h"
#include "engine/model/model.h"
#include "kiln/v1/model_spec.pb.h"
#include "server/jobs/spec_translation.h"
#include "tests/fuzz/fuzz_check.h"

namespace kiln {
namespace {

void CheckRejection(const absl::Status& status) {
  const absl::StatusCode code = status.code();
  KILN_FUZZ_CHECK(
      code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kResourceExhausted,
      "undocumented error %s", status.ToString().c_str());
  const std::string message(status.message());
  KILN_FUZZ_CHECK(absl::StartsWith(message, "spec."), "the error names no field: %s",
                  message.c_str());
}

void CheckAccepted(const TrainConfig& config, const server::SpecLimits& limits) {
  KILN_FUZZ_CHECK(static_cast<int64_t>(config.model.layers.size()) <= limits.max_layers,
                  "%zu layers accepted", config.model.layers.size());
  const absl::StatusOr<std::vector<Shape>> shapes = InferShapes(config.model);
  KILN_FUZZ_CHECK(shapes.ok(), "an accepted model does not infer: %s",
                  shapes.status().ToString().c_str());
  KILN_FUZZ_CHECK(shapes->back().size() == 1, "an accepted model outputs %s, not logits",
                  ShapeString(shapes->back()).c_str());
  const int64_t parameters = CountParameters(config.model);
  KILN_FUZZ_CHECK(parameters >= 0 && parameters <= limits.max_parameters,
                  "%lld parameters accepted", static_cast<long long>(parameters));
  KILN_FUZZ_CHECK(config.epochs >= 1 && config.epochs <= limits.max_epochs, "%d epochs accepted",
                  config.epochs);
  KILN_FUZZ_CHECK(config.batch_size >= 1 && config.batch_size <= limits.max_batch_size,
                  "batch size %d accepted", config.batch_size);
  KILN_FUZZ_CHECK(std::isfinite(config.optimizer.lr) && config.optimizer.lr > 0,
                  "learning rate %g accepted", config.optimizer.lr);
  KILN_FUZZ_CHECK(std::isfinite(config.norm.scale) && std::isfinite(config.norm.mean) &&
                      std::isfinite(config.norm.std) && config.norm.std > 0,
                  "normalisation scale %g mean %g std %g accepted", config.norm.scale,
                  config.norm.mean, config.norm.std);
  KILN_FUZZ_CHECK(config.augment.random_crop_padding >= 0 &&
                      config.augment.random_crop_padding <= kMaxCropPadding,
                  "crop padding %d accepted", config.augment.random_crop_padding);
}

}  // namespace
}  // namespace kiln

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::v1::JobSpec spec;
  if (!spec.ParseFromArray(data, static_cast<int>(size))) return 0;
  const kiln::server::SpecLimits limits;
  const absl::StatusOr<kiln::TrainConfig> config = kiln::server::TranslateSpec(spec, limits);
  if (!config.ok()) {
    kiln::CheckRejection(config.status());
    return 0;
  }
  kiln::CheckAccepted(*config, limits);
  return 0;
}
