#include "server/serving/model_repository.h"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "engine/backend_registry.h"
#include "engine/model/checkpoint.h"
#include "engine/inference.h"
#include "engine/memory_plan.h"
#include "engine/model/sequence_model.h"

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

// Version numbers: positive integers written plainly ("1", "12"), below 2^53 so that every JSON
// reader keeps them exact.
absl::StatusOr<int64_t> ParseVersionNumber(const std::string& text) {
  int64_t n = 0;
  const bool plain = !text.empty() && text.size() <= 16 && text[0] != '0' &&
                     std::all_of(text.begin(), text.end(), absl::ascii_isdigit);
  if (!plain || !absl::SimpleAtoi(text, &n) || n < 1 || n >= (int64_t{1} << 53)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "version \"", text, "\" must be a version number: a positive integer such as 1 or 2"));
  }
  return n;
}

absl::Status Prefixed(const std::string& model, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat("model \"", model, "\": ", std::string(status.message())));
}

// A checkpoint damaged on disk must not be served (it may answer NaN, or worse, plausibly).
absl::Status CheckSha256(const ResolvedCheckpoint& resolved) {
  if (resolved.sha256.empty()) return absl::OkStatus();
  absl::StatusOr<std::string> actual = Sha256OfFile(resolved.path);
  if (!actual.ok()) return actual.status();
  if (*actual != resolved.sha256) {
    return absl::DataLossError(absl::StrCat("checkpoint file ", resolved.path, " has sha256 ",
                                            *actual, " but ", resolved.sha256,
                                            " when it was written: the file was damaged on disk"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<VersionPolicy> VersionPolicy::Parse(const std::string& text) {
  const auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("version_policy \"", text, "\" must be latest:N (N in 1..",
                     kMaxVersionsPerModel, "), all, or specific:V[,V...] with version numbers"));
  };
  VersionPolicy policy;
  if (text == "all") {
    policy.kind = Kind::kAll;
    return policy;
  }
  if (absl::StartsWith(text, "latest:")) {
    policy.kind = Kind::kLatest;
    if (!absl::SimpleAtoi(text.substr(7), &policy.latest) || policy.latest < 1 ||
        policy.latest > kMaxVersionsPerModel) {
      return bad();
    }
    return policy;
  }
  if (absl::StartsWith(text, "specific:")) {
    policy.kind = Kind::kSpecific;
    for (absl::string_view part : absl::StrSplit(text.substr(9), ',')) {
      absl::StatusOr<int64_t> n = ParseVersionNumber(std::string(part));
      if (!n.ok()) return bad();
      policy.specific.insert(*n);
    }
    if (static_cast<int>(policy.specific.size()) > kMaxVersionsPerModel) return bad();
    return policy;
  }
  return bad();
}

std::string VersionPolicy::ToString() const {
  switch (kind) {
    case Kind::kAll:
      return "all";
    case Kind::kSpecific:
      return absl::StrCat("specific:", absl::StrJoin(specific, ","));
    case Kind::kLatest:
      break;
  }
  return absl::StrCat("latest:", latest);
}

absl::StatusOr<ResolvedCheckpoint> ResolveCheckpointFile(const std::string& source) {
  std::error_code ec;
  if (source.empty() || !std::filesystem::is_regular_file(source, ec)) {
    return absl::NotFoundError(absl::StrCat("checkpoint \"", source, "\": no such file"));
  }
  ResolvedCheckpoint resolved;
  resolved.path = source;
  return resolved;
}

ModelRepository::ModelRepository(ModelRepositoryOptions options)
    : options_(std::move(options)),
      budget_(ServingMemoryBudget::Create(options_.max_total_memory_bytes)) {}

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
  int64_t number = 0;  // 0: the model's next number
  if (!request.version.empty()) {
    absl::StatusOr<int64_t> n = ParseVersionNumber(request.version);
    if (!n.ok()) return Prefixed(request.model, n.status());
    number = *n;
  }
  if (absl::Status s = CheckOptions(request.options); !s.ok()) return Prefixed(request.model, s);

  const std::string& source = request.source.empty() ? request.model : request.source;
  absl::StatusOr<ResolvedCheckpoint> resolved = options_.resolver(source);
  if (!resolved.ok()) return Prefixed(request.model, resolved.status());
  for (const std::string& alias : resolved->aliases) {
    if (absl::Status s = CheckName("alias", alias); !s.ok()) return Prefixed(request.model, s);
  }
  KILN_ASSIGN_OR_RETURN(number, NumberToLoad(request, number));
  if (absl::Status s = CheckSha256(*resolved); !s.ok()) return Prefixed(request.model, s);

  auto version = std::shared_ptr<ServedVersion>(new ServedVersion());
  version->model_ = request.model;
  version->version_ = std::to_string(number);
  version->checkpoint_path_ = resolved->path;
  version->source_ = resolved->pinned_source.empty() ? source : resolved->pinned_source;
  version->options_ = request.options;
  // Creating a backend binds this thread to it, which suits the session's warm-up forward pass
  // below; when this call returns, the thread gets its own binding back.
  const ScopedThreadBinding caller_binding;
  KILN_RETURN_IF_ERROR(StartVersion(*version));

  // Versions replaced or pushed out are released after the lock, where the last reference may
  // stop a batcher's worker thread.
  std::vector<std::shared_ptr<const ServedVersion>> released;
  KILN_RETURN_IF_ERROR(AddVersion(request, resolved->aliases, number, version, &released));
  return std::shared_ptr<const ServedVersion>(version);
}

absl::StatusOr<int64_t> ModelRepository::NumberToLoad(const LoadRequest& request, int64_t number) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = models_.find(request.model);
  int64_t& next = next_number_.try_emplace(request.model, 1).first->second;
  if (number == 0) {
    // Numbers keep counting across unloads, so a number never names two checkpoints.
    while (it != models_.end() && it->second.versions.count(next) > 0) ++next;
    number = next;
  }
  // A model under a specific policy takes only the numbers it lists.
  const VersionPolicy policy = request.policy        ? *request.policy
                               : it != models_.end() ? it->second.policy
                                                     : DefaultPolicy();
  if (policy.kind == VersionPolicy::Kind::kSpecific && policy.specific.count(number) == 0) {
    return Prefixed(request.model,
                    absl::FailedPreconditionError(absl::StrCat(
                        "version ", number, " is not in the model's version policy ",
                        policy.ToString(), "; give one of those numbers as the version")));
  }
  if (policy.kind == VersionPolicy::Kind::kLatest && it != models_.end() &&
      it->second.versions.count(number) == 0) {
    int higher = 0;
    for (const auto& [n, v] : it->second.versions) higher += n > number ? 1 : 0;
    if (higher >= policy.latest) {
      return Prefixed(
          request.model,
          absl::FailedPreconditionError(absl::StrCat(
              "version ", number,
              " would not stay loaded: the model's version "
              "policy ",
              policy.ToString(), " keeps higher ones (loaded: ", VersionList(it->second), ")")));
    }
  }
  if (policy.kind == VersionPolicy::Kind::kAll && it != models_.end() &&
      it->second.versions.count(number) == 0 &&
      static_cast<int>(it->second.versions.size()) >= kMaxVersionsPerModel) {
    return Prefixed(request.model, absl::ResourceExhaustedError(absl::StrCat(
                                       "the model has ", kMaxVersionsPerModel,
                                       " versions loaded, the most one model keeps; unload "
                                       "one or choose a latest:N policy")));
  }
  return number;
}

absl::Status ModelRepository::StartVersion(ServedVersion& version) const {
  const DeploymentOptions& options = version.options_;
  const std::string who =
      absl::StrCat("model \"", version.model_, "\" version \"", version.version_, "\"");
  BackendOptions backend_options;
  backend_options.threads = options.threads;
  backend_options.precision = options.precision;
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      options_.backend_factory ? options_.backend_factory(options.device, backend_options)
                               : CreateBackend(options.device, backend_options);
  if (!backend.ok()) {
    return absl::Status(backend.status().code(),
                        absl::StrCat(who, ": device \"", options.device,
                                     "\": ", std::string(backend.status().message())));
  }
  version.backend_ = std::move(*backend);
  if (absl::Status reserved = ReserveMemory(version, backend_options); !reserved.ok()) {
    return absl::Status(reserved.code(), absl::StrCat(who, ": ", reserved.message()));
  }
  absl::StatusOr<CheckpointInfo> info = ReadCheckpointInfo(version.checkpoint_path_);
  if (info.ok() && SequenceModelShapeOf(info->model).ok()) return StartLanguageModel(version);
  absl::StatusOr<std::unique_ptr<InferenceSession>> session = InferenceSession::FromCheckpoint(
      version.checkpoint_path_, version.backend_.get(), options.batching.max_batch_size);
  if (!session.ok()) {
    return absl::Status(session.status().code(),
                        absl::StrCat(who, ": ", std::string(session.status().message())));
  }
  version.input_shape_ = (*session)->input_shape();
  version.input_elems_ = (*session)->input_elems();
  version.num_classes_ = (*session)->num_classes();
  // A thread binds itself to the backend before it runs a forward pass; where any thread may
  // issue ops (the CPU), idle requests run on their gRPC thread. The backend outlives the batcher.
  Backend* const served_backend = version.backend_.get();
  std::function<void()> prepare_thread = [served_backend] { served_backend->BindCallingThread(); };
  const bool callers_run_when_idle = served_backend->IssuesFromAnyThread();
  KILN_ASSIGN_OR_RETURN(version.batcher_,
                        DynamicBatcher::Create(std::move(*session), options.batching, who,
                                               std::move(prepare_thread), callers_run_when_idle));
  version.reservation_.Loaded();
  return absl::OkStatus();
}

absl::Status ModelRepository::StartLanguageModel(ServedVersion& version) const {
  const std::string who =
      absl::StrCat("model \"", version.model_, "\" version \"", version.version_, "\"");
  absl::StatusOr<std::unique_ptr<LanguageModel>> lm = LanguageModel::FromCheckpoint(
      version.checkpoint_path_, version.backend_.get(), version.options_.batching.max_batch_size);
  if (!lm.ok()) {
    return absl::Status(lm.status().code(),
                        absl::StrCat(who, ": ", std::string(lm.status().message())));
  }
  version.input_shape_ = {(*lm)->shape().context};
  version.input_elems_ = (*lm)->shape().context;
  version.num_classes_ = (*lm)->shape().vocab;
  version.language_model_ = std::move(*lm);
  version.reservation_.Loaded();
  return absl::OkStatus();
}

absl::Status ModelRepository::ReserveMemory(ServedVersion& version,
                                            const BackendOptions& backend_options) const {
  const DeploymentOptions& options = version.options_;
  KILN_ASSIGN_OR_RETURN(const int64_t need, PlanMemory(version.checkpoint_path_, options,
                                                       version.backend_->kind(), backend_options));
  // Reserved before the checkpoint is read, so that loads under way count against the budget
  // too. A version this one replaces (the same number) or that the policy pushes out once it is
  // loaded still holds its share meanwhile: both are in memory at once until it goes.
  absl::StatusOr<ServingMemoryBudget::Reservation> reserved = budget_->Reserve(need);
  if (!reserved.ok()) {
    return absl::Status(reserved.status().code(), absl::StrCat("serving it at max_batch_size ",
                                                               options.batching.max_batch_size, " ",
                                                               reserved.status().message()));
  }
  version.reservation_ = std::move(*reserved);
  return absl::OkStatus();
}

absl::Status ModelRepository::AddVersion(
    const LoadRequest& request, const std::vector<std::string>& aliases, int64_t number,
    std::shared_ptr<const ServedVersion> version,
    std::vector<std::shared_ptr<const ServedVersion>>* released) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, created] = models_.try_emplace(request.model);
  Model& model = it->second;
  if (created) model.policy = DefaultPolicy();
  if (request.policy) model.policy = *request.policy;
  if (request.follow) model.follow = *request.follow;
  if (auto old = model.versions.find(number); old != model.versions.end()) {
    released->push_back(old->second);
    RemoveVersion(model, number);
  }
  model.versions[number] = std::move(version);
  int64_t& next = next_number_.try_emplace(request.model, 1).first->second;
  next = std::max(next, number + 1);
  for (const std::string& alias : aliases) model.aliases[alias] = number;
  // The policy decides what stays: the highest numbers, or the listed ones. The version just
  // loaded may itself go (a lower number than `latest` keeps); it was still loaded and checked.
  std::vector<int64_t> drop;
  if (model.policy.kind == VersionPolicy::Kind::kLatest) {
    int kept = 0;
    for (auto v = model.versions.rbegin(); v != model.versions.rend(); ++v) {
      if (++kept > model.policy.latest) drop.push_back(v->first);
    }
  } else if (model.policy.kind == VersionPolicy::Kind::kSpecific) {
    for (const auto& [n, v] : model.versions) {
      if (model.policy.specific.count(n) == 0) drop.push_back(n);
    }
  }
  for (int64_t n : drop) {
    released->push_back(model.versions[n]);
    RemoveVersion(model, n);
  }
  if (model.versions.count(number) == 0) {
    return Prefixed(
        request.model,
        absl::FailedPreconditionError(absl::StrCat(
            "version ", number, " loaded but the model's version policy ", model.policy.ToString(),
            " keeps higher ones (loaded: ", VersionList(model), ")")));
  }
  unloaded_.erase(request.model);
  if (auto failed = unavailable_.find(request.model); failed != unavailable_.end()) {
    failed->second.erase(std::to_string(number));
    if (failed->second.empty()) unavailable_.erase(failed);
  }
  return absl::OkStatus();
}

void ModelRepository::RemoveVersion(Model& model, int64_t number) {
  model.versions.erase(number);
  for (auto it = model.aliases.begin(); it != model.aliases.end();) {
    it = it->second == number ? model.aliases.erase(it) : std::next(it);
  }
}

int64_t ModelRepository::FindVersionLocked(const Model& model, const std::string& version) {
  int64_t number = 0;
  if (auto a = model.aliases.find(version); a != model.aliases.end()) {
    number = a->second;
  } else if (absl::StatusOr<int64_t> n = ParseVersionNumber(version); n.ok()) {
    number = *n;
  }
  return model.versions.count(number) > 0 ? number : 0;
}

VersionPolicy ModelRepository::DefaultPolicy() const {
  VersionPolicy policy;
  policy.latest = std::clamp(options_.max_versions_per_model, 1, kMaxVersionsPerModel);
  return policy;
}

std::string ModelRepository::VersionList(const Model& model) {
  std::vector<int64_t> numbers;
  for (const auto& [n, v] : model.versions) numbers.push_back(n);
  return absl::StrJoin(numbers, ", ");
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
    return UnknownModel(model);
  }
  Model& m = it->second;
  if (version.empty()) {
    for (auto& [label, v] : m.versions) released.push_back(v);
    models_.erase(it);
  } else {
    const int64_t found = FindVersionLocked(m, version);
    if (found == 0) {
      return absl::NotFoundError(absl::StrCat("model \"", model, "\" has no version \"", version,
                                              "\" (versions: ", VersionList(m), ")"));
    }
    released.push_back(m.versions[found]);
    RemoveVersion(m, found);
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
  if (version.empty()) return m.versions.rbegin()->second;
  if (const int64_t found = FindVersionLocked(m, version); found != 0) return m.versions.at(found);
  return absl::NotFoundError(absl::StrCat("model \"", model, "\" has no version \"", version,
                                          "\" (versions: ", VersionList(m), ")"));
}

absl::StatusOr<std::shared_ptr<const ServedVersion>> ModelRepository::FindFor(
    const server::Caller& caller, const std::string& model, const std::string& version) const {
  if (!options_.sees_source) return Find(model, version);
  absl::StatusOr<std::shared_ptr<const ServedVersion>> newest = Find(model, "");
  if (!options_.sees_source(caller, newest.ok() ? (*newest)->source() : "")) {
    return UnknownModel(model);
  }
  if (version.empty()) return newest;  // the default version is the newest, checked above
  absl::StatusOr<std::shared_ptr<const ServedVersion>> found = Find(model, version);
  if (found.ok() && !options_.sees_source(caller, (*found)->source())) return UnknownModel(model);
  return found;
}

absl::Status ModelRepository::UnknownModel(const std::string& model) {
  return absl::NotFoundError(absl::StrCat("unknown model \"", model, "\""));
}

void ModelRepository::MarkUnavailable(const std::string& model, const std::string& version,
                                      const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  unavailable_[model][version] = reason;
}

absl::StatusOr<std::vector<std::string>> ModelRepository::Versions(const std::string& model) const {
  std::lock_guard<std::mutex> lock(mu_);
  KILN_ASSIGN_OR_RETURN(const Model* m, FindModelLocked(model));
  std::vector<std::string> numbers;
  for (const auto& [n, v] : m->versions) numbers.push_back(std::to_string(n));
  return numbers;
}

absl::StatusOr<VersionPolicy> ModelRepository::PolicyOf(const std::string& model) const {
  std::lock_guard<std::mutex> lock(mu_);
  KILN_ASSIGN_OR_RETURN(const Model* m, FindModelLocked(model));
  return m->policy;
}

absl::StatusOr<std::string> ModelRepository::FollowOf(const std::string& model) const {
  std::lock_guard<std::mutex> lock(mu_);
  KILN_ASSIGN_OR_RETURN(const Model* m, FindModelLocked(model));
  return m->follow;
}

std::vector<std::pair<std::string, std::string>> ModelRepository::Following() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, m] : models_) {
    if (!m.follow.empty()) out.emplace_back(name, m.follow);
  }
  return out;
}

absl::StatusOr<int64_t> ModelRepository::PlanMemory(const std::string& checkpoint,
                                                    const DeploymentOptions& options,
                                                    DeviceKind device,
                                                    const BackendOptions& backend_options) const {
  // An unreadable checkpoint is for loading it to report, with its own message.
  absl::StatusOr<CheckpointInfo> info = ReadCheckpointInfo(checkpoint);
  if (!info.ok()) return 0;
  MemoryTarget target;
  target.device = device;
  target.threads = CpuBackendThreads(backend_options);
  target.precision = backend_options.precision;
  KILN_ASSIGN_OR_RETURN(MemoryPlan plan,
                        PlanInferenceMemory(info->model, options.batching.max_batch_size, target));
  const int64_t need = plan.total_bytes(), limit = options_.max_memory_bytes;
  if (need <= limit) return need;
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
  return UnknownModel(model);
}

std::vector<ModelIndexEntry> ModelRepository::Index() const {
  std::vector<ModelIndexEntry> index;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, model] : models_) {
    for (const auto& [n, v] : model.versions) {
      index.push_back({name, v->version(), "READY", "", v->source()});
    }
  }
  for (const std::string& name : unloaded_)
    index.push_back({name, "", "UNAVAILABLE", "unloaded", ""});
  for (const auto& [name, versions] : unavailable_) {
    for (const auto& [label, reason] : versions) {
      index.push_back({name, label, "UNAVAILABLE", reason, ""});
    }
  }
  std::stable_sort(
      index.begin(), index.end(),
      [](const ModelIndexEntry& a, const ModelIndexEntry& b) { return a.name < b.name; });
  return index;
}

std::vector<ModelIndexEntry> ModelRepository::IndexFor(const server::Caller& caller) const {
  std::vector<ModelIndexEntry> index = Index();
  if (!options_.sees_source) return index;
  std::erase_if(index,
                [&](const ModelIndexEntry& e) { return !options_.sees_source(caller, e.source); });
  return index;
}

std::vector<VersionQueue> ModelRepository::Queues() const {
  std::vector<VersionQueue> queues;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, model] : models_) {
    for (const auto& [n, v] : model.versions) {
      if (v->language_model() != nullptr) continue;  // no batcher: calls take turns
      queues.push_back({name, v->version(), v->batcher().queued_requests()});
    }
  }
  return queues;
}

}  // namespace kiln::serving
