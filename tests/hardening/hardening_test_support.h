// Checks the hardening tests share: the store's and a checkpoint's integrity as the engine and
// SQLite see them, a process's resident memory, and kilnd's health service.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/trainer.h"
#include "kiln/v1/training.pb.h"

namespace kiln::server::hardening {

// Runs `PRAGMA integrity_check` on the SQLite database at `path`, opened read-only; returns its
// rows joined by "; " ("ok" for a sound database) or the error that stopped it.
std::string SqliteIntegrityCheck(const std::string& path);

// Loads a checkpoint the way kilnd resumes a job of `spec`: a Trainer for the spec on the CPU,
// over the dataset in `dataset_dir`, restoring weights, optimizer state and position from
// `path`. Returns the position it holds.
absl::StatusOr<TrainingPosition> LoadCheckpointForSpec(const v1::JobSpec& spec,
                                                       const std::string& dataset_dir,
                                                       const std::string& path);

// Descriptors process `pid` holds open, from /proc/PID/fd; -1 when unreadable.
int OpenDescriptors(pid_t pid);

// VmRSS of process `pid` in bytes, from /proc/PID/status; -1 when unreadable.
int64_t ResidentBytes(pid_t pid);

// CPU time (user + system, all threads) process `pid` has used, in seconds, from /proc/PID/stat;
// -1 when unreadable.
double CpuSeconds(pid_t pid);

// grpc.health.v1 Check of `service` ("": the server as a whole) at 127.0.0.1:`port`: true when
// SERVING.
bool HealthServing(int port, const std::string& service = "");

}  // namespace kiln::server::hardening
