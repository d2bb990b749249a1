// A job's training data as its trainer takes it, one rule for kilnd's runner and kiln-worker:
// samples loaded into memory (images, tables) or a language model's token shards mapped.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/data/dataset.h"
#include "engine/data/token_data.h"
#include "engine/trainer.h"
#include "server/datasets/dataset_catalog.h"

namespace kiln::server {

struct JobData {
  DatasetSplits splits;                // image and table datasets
  std::optional<TokenDataset> tokens;  // text and tokens datasets (config.max_iters > 0)

  // What TrainingRun counts a step's samples against: the training split's samples, or for a
  // token run, where every step is a whole batch of windows, no end.
  int64_t TrainSize() const;
};

// Loads `name` from `catalog` as `config` trains on it; errors say "loading dataset "NAME": ...".
absl::StatusOr<JobData> LoadJobData(const DatasetCatalog& catalog, const std::string& name,
                                    const TrainConfig& config);

// The trainer over `data` (which must outlive it).
absl::StatusOr<std::unique_ptr<Trainer>> CreateJobTrainer(const TrainConfig& config,
                                                          Backend* backend, const JobData& data);

}  // namespace kiln::server
