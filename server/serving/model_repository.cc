#include "server/serving/model_repository.h"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "engine/backend_registry.h"
#include "engine/checkpoint.h"
#include "engine/inference.h"
#include "engine/memory_plan.h"

namespace kiln::serving {
namespace {

constexpr size_t kMaxNameLength = 128;
constexpr size_t kMaxUnloadedRemembered = 10000;

// Model names, version labels and aliases: 1..128 of [A-Za-z0-9._-].
absl::Status CheckName(const char* what, const std::string& name) {
  const bool ok = !name.empty() && name.size() <= kMaxNameLength &&
                  std::all_of(name.begin(), name.end(), [](char c) {
                    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' ||
                           c == '_' || c == '-';
                  });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, " \"", name, "\" must be 1 to ", kMaxNameLength, " of A-Z a-z 0-9 . _ -"));
}

absl::Status Prefixed(const std::string& model, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat("model \"", model, "\": ", std::string(status.message())));
}

}  // namespace

absl::StatusOr<ResolvedCheckpoint> ResolveCheckpointFile(const std::string& source) {
  std::error_code ec;
  if (source.empty() || !std::filesystem::is_regular_file(source, ec)) {
    return absl::NotFoundError(absl::StrCat("checkpoint \"", source, "\": no such file"));
  }
  ResolvedCheckpoint resolved;
  resolved.path = source;
  return resolved;
}

ModelRepository::ModelRepository(ModelRepositoryOptions options) : options_(std::move(options)) {}

absl::Status ModelRepository::CheckOptions(const DeploymentOptions& options) const {
  if (options.threads < 0 || options.threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads must be in 0..1024, got ", options.threads));
  }
  const BatchingOptions& b = options.batching;
  if (b.max_batch_size < 1 || b.max_batch_size > options_.max_batch_size_limit) {
    return absl::InvalidArgumentError(absl::StrCat("max_batch_size must be in 1..",
                                                   options_.max_batch_size_limit, ", got ",
                                                   b.max_batch_size));
  }
  if (b.max_queue_delay_us < 0 || b.max_queue_delay_us > options_.max_queue_delay_us_limit) {
    return absl::InvalidArgumentError(absl::StrCat("max_queue_delay_us must be in 0..",
                                                   options_.max_queue_delay_us_limit, ", got ",
                                                   b.max_queue_delay_us));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const ServedVersion>> ModelRepository::Load(
    const LoadRequest& request) {
  KILN_RETURN_IF_ERROR(CheckName("model name", request.model));
  if (!request.version.empty()) KILN_RETURN_IF_ERROR(CheckName("version", request.version));
  if (absl::Status s = CheckOptions(request.options); !s.ok()) return Prefixed(request.model, s);

  const std::string& source = request.source.empty() ? request.model : request.source;
  absl::StatusOr<ResolvedCheckpoint> resolved = options_.resolver(source);
  if (!resolved.ok()) return Prefixed(request.model, resolved.status());
  std::string label = request.version.empty() ? resolved->version : request.version;
  if (!label.empty()) {
    if (absl::Status s = CheckName("version", label); !s.ok()) return Prefixed(request.model, s);
  }
  for (const std::string& alias : resolved->aliases) {
    if (absl::Status s = CheckName("alias", alias); !s.ok()) return Prefixed(request.model, s);
  }
  if (label.empty()) {
    // Numbers keep counting across unloads, so a number never names two checkpoints.
    std::lock_guard<std::mutex> lock(mu_);
    int64_t& next = next_number_.try_emplace(request.model, 1).first->second;
    auto it = models_.find(request.model);
    do {
      label = std::to_string(next++);
    } while (it != models_.end() && it->second.versions.count(label) > 0);
  }

  if (!resolved->sha256.empty()) {
    // A checkpoint damaged on disk must not be served (it may answer NaN, or worse, plausibly).
    absl::StatusOr<std::string> actual = Sha256OfFile(resolved->path);
    if (!actual.ok()) return Prefixed(request.model, actual.status());
    if (*actual != resolved->sha256) {
      return Prefixed(request.model,
                      absl::DataLossError(absl::StrCat(
                          "checkpoint file ", resolved->path, " has sha256 ", *actual, " but ",
                          resolved->sha256, " when it was written: the file was damaged on disk")));
    }
  }
  auto version = std::shared_ptr<ServedVersion>(new ServedVersion());
  version->model_ = request.model;
  version->version_ = label;
  version->checkpoint_path_ = resolved->path;
  version->source_ = resolved->pinned_source.empty() ? source : resolved->pinned_source;
  version->options_ = request.options;
  const std::string who = absl::StrCat("model \"", request.model, "\" version \"", label, "\"");
  BackendOptions backend_options;
  backend_options.threads = request.options.threads;

  // Creating a backend binds this thread to it, which suits the session's warm-up forward pass
  // below; when this call returns, the thread gets its own binding back.
  const ScopedThreadBinding caller_binding;
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      options_.backend_factory ? options_.backend_factory(request.options.device, backend_options)
                               : CreateBackend(request.options.device, backend_options);
  if (!backend.ok()) {
    return absl::Status(backend.status().code(),
                        absl::StrCat(who, ": device \"", request.options.device,
                                     "\": ", std::string(backend.status().message())));
  }
  version->backend_ = std::move(*backend);
  if (absl::Status fits =
          CheckMemory(resolved->path, request.options, version->backend_->kind(), backend_options);
      !fits.ok()) {
    return absl::Status(fits.code(), absl::StrCat(who, ": ", fits.message()));
  }
  absl::StatusOr<std::unique_ptr<InferenceSession>> session = InferenceSession::FromCheckpoint(
      resolved->path, version->backend_.get(), request.options.batching.max_batch_size);
  if (!session.ok()) {
    return absl::Status(session.status().code(),
                        absl::StrCat(who, ": ", std::string(session.status().message())));
  }
  version->input_shape_ = (*session)->input_shape();
  version->input_elems_ = (*session)->input_elems();
  version->num_classes_ = (*session)->num_classes();
  // A thread binds itself to the backend before it runs a forward pass; where any thread may
  // issue ops (the CPU), idle requests run on their gRPC thread. The backend outlives the batcher.
  Backend* const served_backend = version->backend_.get();
  std::function<void()> prepare_thread = [served_backend] { served_backend->BindCallingThread(); };
  const bool callers_run_when_idle = served_backend->IssuesFromAnyThread();
  KILN_ASSIGN_OR_RETURN(version->batcher_,
                        DynamicBatcher::Create(std::move(*session), request.options.batching, who,
                                               std::move(prepare_thread), callers_run_when_idle));

  // Versions replaced or pushed out are released after the lock, where the last reference may
  // stop a batcher's worker thread.
  std::vector<std::shared_ptr<const ServedVersion>> released;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Model& model = models_[request.model];
    if (auto it = model.versions.find(label); it != model.versions.end()) {
      released.push_back(it->second);
      RemoveVersion(model, label);
    }
    model.versions[label] = version;
    model.load_order.push_back(label);
    for (const std::string& alias : resolved->aliases) model.aliases[alias] = label;
    while (static_cast<int>(model.load_order.size()) >
           std::max(1, options_.max_versions_per_model)) {
      const std::string oldest = model.load_order.front();
      released.push_back(model.versions[oldest]);
      RemoveVersion(model, oldest);
    }
    unloaded_.erase(request.model);
    if (auto failed = unavailable_.find(request.model); failed != unavailable_.end()) {
      failed->second.erase(label);
      if (failed->second.empty()) unavailable_.erase(failed);
    }
  }
  return std::shared_ptr<const ServedVersion>(version);
}

void ModelRepository::RemoveVersion(Model& model, const std::string& label) {
  model.versions.erase(label);
  model.load_order.erase(std::remove(model.load_order.begin(), model.load_order.end(), label),
                         model.load_order.end());
  for (auto it = model.aliases.begin(); it != model.aliases.end();) {
    it = it->second == label ? model.aliases.erase(it) : std::next(it);
  }
}

absl::Status ModelRepository::Unload(const std::string& model, const std::string& version) {
  // Destroyed after `lock` is released: a last reference stops its batcher's thread unlocked.
  std::vector<std::shared_ptr<const ServedVersion>> released;
  std::lock_guard<std::mutex> lock(mu_);
  // A version that never came back after a restart is let go like a loaded one.
  bool was_unavailable = false;
  if (auto failed = unavailable_.find(model); failed != unavailable_.end()) {
    if (version.empty()) {
      unavailable_.erase(failed);
      was_unavailable = true;
    } else if (failed->second.erase(version) > 0) {
      if (failed->second.empty()) unavailable_.erase(failed);
      return absl::OkStatus();
    }
  }
  auto it = models_.find(model);
  if (it == models_.end()) {
    // Unloading twice changes nothing.
    if (unloaded_.count(model) > 0 || was_unavailable) return absl::OkStatus();
    return absl::NotFoundError(absl::StrCat("unknown model \"", model, "\""));
  }
  Model& m = it->second;
  if (version.empty()) {
    for (auto& [label, v] : m.versions) released.push_back(v);
    models_.erase(it);
  } else {
    std::string label = version;
    if (m.versions.count(label) == 0) {
      auto alias = m.aliases.find(version);
      if (alias == m.aliases.end()) {
        return absl::NotFoundError(absl::StrCat("model \"", model, "\" has no version \"", version,
                                                "\" (versions: ", absl::StrJoin(m.load_order, ", "),
                                                ")"));
      }
      label = alias->second;
    }
    released.push_back(m.versions[label]);
    RemoveVersion(m, label);
    if (!m.versions.empty()) return absl::OkStatus();
    models_.erase(it);
  }
  if (unloaded_.size() >= kMaxUnloadedRemembered) unloaded_.erase(unloaded_.begin());
  unloaded_.insert(model);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const ServedVersion>> ModelRepository::Find(
    const std::string& model, const std::string& version) const {
  std::lock_guard<std::mutex> lock(mu_);
  KILN_ASSIGN_OR_RETURN(const Model* found, FindModelLocked(model));
  const Model& m = *found;
  if (version.empty()) return m.versions.at(m.load_order.back());
  if (auto v = m.versions.find(version); v != m.versions.end()) return v->second;
  if (auto a = m.aliases.find(version); a != m.aliases.end()) return m.versions.at(a->second);
  return absl::NotFoundError(absl::StrCat("model \"", model, "\" has no version \"", version,
                                          "\" (versions: ", absl::StrJoin(m.load_order, ", "),
                                          ")"));
}

void ModelRepository::MarkUnavailable(const std::string& model, const std::string& version,
                                      const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  unavailable_[model][version] = reason;
}

absl::StatusOr<std::vector<std::string>> ModelRepository::Versions(const std::string& model) const {
  std::lock_guard<std::mutex> lock(mu_);
  KILN_ASSIGN_OR_RETURN(const Model* m, FindModelLocked(model));
  return m->load_order;
}

absl::Status ModelRepository::CheckMemory(const std::string& checkpoint,
                                          const DeploymentOptions& options, DeviceKind device,
                                          const BackendOptions& backend_options) const {
  // An unreadable checkpoint is for loading it to report, with its own message.
  absl::StatusOr<CheckpointInfo> info = ReadCheckpointInfo(checkpoint);
  if (!info.ok()) return absl::OkStatus();
  MemoryTarget target;
  target.device = device;
  target.threads = CpuBackendThreads(backend_options);
  KILN_ASSIGN_OR_RETURN(MemoryPlan plan,
                        PlanInferenceMemory(info->model, options.batching.max_batch_size, target));
  const int64_t need = plan.total_bytes(), limit = options_.max_memory_bytes;
  if (need <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "serving it at max_batch_size ", options.batching.max_batch_size, " needs ",
      FormatBytes(need), " of memory (the most: ", plan.largest().Describe(),
      "), over the limit of ", FormatBytes(limit), " (", limit, " bytes, --max_job_memory_bytes)"));
}

absl::StatusOr<const ModelRepository::Model*> ModelRepository::FindModelLocked(
    const std::string& model) const {
  auto it = models_.find(model);
  if (it != models_.end()) return &it->second;
  if (unloaded_.count(model) > 0) {
    return absl::UnavailableError(absl::StrCat("model \"", model, "\" is unloaded"));
  }
  if (auto failed = unavailable_.find(model); failed != unavailable_.end()) {
    const auto& [version, reason] = *failed->second.rbegin();
    return absl::UnavailableError(
        absl::StrCat("model \"", model, "\" version \"", version, "\" is unavailable: ", reason));
  }
  return absl::NotFoundError(absl::StrCat("unknown model \"", model, "\""));
}

std::vector<ModelIndexEntry> ModelRepository::Index() const {
  std::vector<ModelIndexEntry> index;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, model] : models_) {
    for (const std::string& label : model.load_order) index.push_back({name, label, "READY", ""});
  }
  for (const std::string& name : unloaded_) index.push_back({name, "", "UNAVAILABLE", "unloaded"});
  for (const auto& [name, versions] : unavailable_) {
    for (const auto& [label, reason] : versions) {
      index.push_back({name, label, "UNAVAILABLE", reason});
    }
  }
  std::stable_sort(
      index.begin(), index.end(),
      [](const ModelIndexEntry& a, const ModelIndexEntry& b) { return a.name < b.name; });
  return index;
}

}  // namespace kiln::serving
