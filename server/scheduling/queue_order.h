// Who goes first on a device, as pure rules over plain facts (no locks, no JobManager), so each
// can be tested alone: the order a device's queue starts in (priority, then fairness between
// teams, then submission), and which running job a waiting one preempts.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/v1/model_spec.pb.h"

namespace kiln::server {

// NORMAL for PRIORITY_UNSPECIFIED; higher runs first.
v1::Priority EffectivePriority(v1::Priority priority);
// "low", "normal", "high": the words of the CLI, the reasons and the metrics' labels.
const char* PriorityName(v1::Priority priority);
// The priority of that word; nullopt for another.
std::optional<v1::Priority> PriorityNamed(std::string_view name);

// A queued job, as the queue holds them (submission order, recovered jobs first).
struct QueuedJob {
  std::string id;
  v1::Priority priority = v1::PRIORITY_NORMAL;
  std::string team;  // its owner's; "" for no team (one group of its own)
};

// What a team runs now, over every device.
struct TeamUsage {
  int running_jobs = 0;
  int gpus = 0;
};

// The indices of `queue` in the order its jobs may start: higher priority first; within a
// priority, the job whose team has fewer running jobs (`usage`; absent: none), so one person's
// 50 jobs do not starve a colleague's one; then queue order.
std::vector<size_t> StartOrder(const std::vector<QueuedJob>& queue,
                               const std::map<std::string, TeamUsage>& usage);

// What one team may run at once (0: no limit), the same for every team.
struct TeamQuota {
  int max_running_jobs = 0;
  int max_gpus = 0;
};

// Why a job of `team` that needs `gpus` GPUs may not start now under `quota` ("team vision runs
// 2 jobs, its quota"), or empty when it may. Jobs of no team are not limited.
std::string QuotaBlock(const std::string& team, const TeamUsage& usage, int gpus,
                       const TeamQuota& quota);

// A running job as preemption sees it.
struct RunningJob {
  std::string id;
  v1::Priority priority = v1::PRIORITY_NORMAL;
  bool preemptible = true;  // false: JobSpec.non_preemptible
  bool stopping = false;    // cancelled, preempted or shut down already: its slot frees soon
  int64_t start_ms = 0;
  std::vector<std::string> devices;
};

// What a job of `priority` waiting for a slot of `device` does about the running jobs there:
// waits for one already stopping (`victim` empty, true), asks the lowest-priority preemptible
// one below it to stop, the latest started among equals (`victim` its id, true), or cannot
// preempt any (false).
bool ChoosePreemption(v1::Priority priority, const std::string& device,
                      const std::vector<RunningJob>& running, std::string* victim);

}  // namespace kiln::server
