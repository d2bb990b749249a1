#include "server/jobs/job_data.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kiln::server {

int64_t JobData::TrainSize() const {
  return tokens.has_value() ? std::numeric_limits<int64_t>::max() : splits.train.size;
}

absl::StatusOr<JobData> LoadJobData(const DatasetCatalog& catalog, const std::string& name,
                                    const TrainConfig& config) {
  auto with_context = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("loading dataset \"", name, "\": ", s.message()));
  };
  JobData data;
  if (config.max_iters > 0) {
    absl::StatusOr<TokenDataset> tokens = catalog.OpenTokens(name);
    if (!tokens.ok()) return with_context(tokens.status());
    data.tokens = *std::move(tokens);
    return data;
  }
  absl::StatusOr<DatasetSplits> splits = catalog.Load(name);
  if (!splits.ok()) return with_context(splits.status());
  data.splits = *std::move(splits);
  return data;
}

absl::StatusOr<std::unique_ptr<Trainer>> CreateJobTrainer(const TrainConfig& config,
                                                          Backend* backend, const JobData& data) {
  if (data.tokens.has_value()) return Trainer::Create(config, backend, &*data.tokens);
  return Trainer::Create(config, backend, &data.splits.train,
                         data.splits.test.size > 0 ? &data.splits.test : nullptr);
}

}  // namespace kiln::server
