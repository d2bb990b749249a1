// The engine's step and epoch events as kiln.v1 messages carry them (job events, Job.last_epoch,
// a worker's reports), and back: one mapping each way, for kilnd and kiln-worker alike.
#pragma once

#include "engine/trainer.h"
#include "kiln/v1/training.pb.h"

namespace kiln::server {

v1::StepMetrics StepMetricsOf(const StepEvent& step);
v1::EpochMetrics EpochMetricsOf(const EpochEvent& epoch);

StepEvent StepEventOf(const v1::StepMetrics& step);
EpochEvent EpochEventOf(const v1::EpochMetrics& epoch);

}  // namespace kiln::server
