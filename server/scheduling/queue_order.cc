#include "server/scheduling/queue_order.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kiln::server {

v1::Priority EffectivePriority(v1::Priority priority) {
  return priority == v1::PRIORITY_UNSPECIFIED ? v1::PRIORITY_NORMAL : priority;
}

const char* PriorityName(v1::Priority priority) {
  switch (EffectivePriority(priority)) {
    case v1::PRIORITY_LOW:
      return "low";
    case v1::PRIORITY_HIGH:
      return "high";
    default:
      return "normal";
  }
}

std::optional<v1::Priority> PriorityNamed(std::string_view name) {
  for (v1::Priority p : {v1::PRIORITY_LOW, v1::PRIORITY_NORMAL, v1::PRIORITY_HIGH}) {
    if (name == PriorityName(p)) return p;
  }
  return std::nullopt;
}

std::vector<size_t> StartOrder(const std::vector<QueuedJob>& queue,
                               const std::map<std::string, TeamUsage>& usage) {
  std::vector<size_t> order(queue.size());
  std::vector<int> running(queue.size(), 0);
  for (size_t i = 0; i < queue.size(); ++i) {
    order[i] = i;
    if (auto it = usage.find(queue[i].team); it != usage.end())
      running[i] = it->second.running_jobs;
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int pa = EffectivePriority(queue[a].priority);
    const int pb = EffectivePriority(queue[b].priority);
    if (pa != pb) return pa > pb;
    return running[a] < running[b];
  });
  return order;
}

std::string QuotaBlock(const std::string& team, const TeamUsage& usage, int gpus,
                       const TeamQuota& quota) {
  if (team.empty()) return "";
  if (quota.max_running_jobs > 0 && usage.running_jobs >= quota.max_running_jobs) {
    return absl::StrCat("team ", team, " runs ", usage.running_jobs,
                        " jobs, its quota (--team_max_running_jobs)");
  }
  if (quota.max_gpus > 0 && gpus > 0 && usage.gpus + gpus > quota.max_gpus) {
    return absl::StrCat("team ", team, " holds ", usage.gpus, " GPUs and this job needs ", gpus,
                        " more; its quota is ", quota.max_gpus, " (--team_max_gpus)");
  }
  return "";
}

bool ChoosePreemption(v1::Priority priority, const std::string& device,
                      const std::vector<RunningJob>& running, std::string* victim) {
  victim->clear();
  const int mine = EffectivePriority(priority);
  const RunningJob* chosen = nullptr;
  for (const RunningJob& r : running) {
    if (std::find(r.devices.begin(), r.devices.end(), device) == r.devices.end()) continue;
    // One already on its way out frees a slot: asking another would stop two for one.
    if (r.stopping) return true;
    const int theirs = EffectivePriority(r.priority);
    if (!r.preemptible || theirs >= mine) continue;
    if (chosen == nullptr || theirs < EffectivePriority(chosen->priority) ||
        (theirs == EffectivePriority(chosen->priority) && r.start_ms > chosen->start_ms)) {
      chosen = &r;
    }
  }
  if (chosen == nullptr) return false;
  *victim = chosen->id;
  return true;
}

}  // namespace kiln::server
