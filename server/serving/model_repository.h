// The deployed models: each a name with versions (a checkpoint, its session and its batcher) and
// aliases such as "latest" and "best", loaded and unloaded while requests are in flight.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/backend_registry.h"
#include "engine/precision.h"
#include "engine/tensor.h"
#include "server/access/caller.h"
#include "server/serving/dynamic_batcher.h"
#include "server/serving/language_model.h"
#include "server/serving/serving_memory_budget.h"

namespace kiln::serving {

// What a model source (e.g. "JOB@best" for the daemon, a file path by default) stands for.
struct ResolvedCheckpoint {
  std::string path;  // the checkpoint file
  // Names that should point at this version from now on, e.g. {"latest", "best"}.
  std::vector<std::string> aliases;
  // The file's SHA-256 when it was written, checked before loading (DATA_LOSS when it differs);
  // empty: not known, not checked.
  std::string sha256;
  // A source that resolves to this very checkpoint later (e.g. "JOB@17" for "JOB@best"), for
  // restoring the deployment after a restart; empty: the source itself does.
  std::string pinned_source;
};

// Maps a model source to a checkpoint; errors pass to the caller of Load as they are.
using CheckpointResolver =
    std::function<absl::StatusOr<ResolvedCheckpoint>(const std::string& source)>;

// The default resolver: `source` is the path of a checkpoint file (NotFound when there is none);
// no aliases.
absl::StatusOr<ResolvedCheckpoint> ResolveCheckpointFile(const std::string& source);

// Makes the backend a version runs on, from a device string ("auto", "cpu", "cuda:N").
using BackendFactory = std::function<absl::StatusOr<std::unique_ptr<Backend>>(
    const std::string& device, const BackendOptions& options)>;

// How one deployment runs.
struct DeploymentOptions {
  std::string device = "auto";
  // CPU threads of the version's forward passes (0: every core). One keeps batch-1 latency low
  // and leaves the cores to training; batches still run at full speed per thread.
  int threads = 1;
  // The forward passes' GEMMs (BackendOptions.precision): kBf16 rounds their inputs to bfloat16,
  // so answers come close to, but not always bit-equal to, kFp32's from the same checkpoint.
  Precision precision = Precision::kFp32;
  BatchingOptions batching;
};

// Which of a model's versions stay loaded (Triton's version_policy): the `latest` N highest
// numbers, `all` of them, or only the `specific` numbers listed.
struct VersionPolicy {
  enum class Kind { kLatest, kAll, kSpecific };
  Kind kind = Kind::kLatest;
  int latest = 3;
  std::set<int64_t> specific;

  // "latest:N" (N in 1..kMaxVersionsPerModel), "all" or "specific:1,3"; InvalidArgument naming
  // the text otherwise.
  static absl::StatusOr<VersionPolicy> Parse(const std::string& text);
  std::string ToString() const;
};

// The most versions one model keeps loaded, whatever its policy says.
inline constexpr int kMaxVersionsPerModel = 16;

struct ModelRepositoryOptions {
  CheckpointResolver resolver = ResolveCheckpointFile;
  BackendFactory backend_factory;  // empty: CreateBackend
  // The policy of a model whose loads never named one: its `max_versions_per_model` highest
  // versions stay loaded.
  int max_versions_per_model = 3;
  int max_batch_size_limit = 1024;             // the largest max_batch_size a deployment may ask
  int64_t max_queue_delay_us_limit = 1000000;  // the longest delay it may ask
  // The most memory one version may need (the engine's inference memory plan at its
  // max_batch_size); more is RESOURCE_EXHAUSTED at load, naming the layer. kilnd passes
  // --max_job_memory_bytes.
  int64_t max_memory_bytes = int64_t{16} << 30;
  // The most memory all versions of all models in memory may need together, each counted by the
  // same plan; a load that would go past it is RESOURCE_EXHAUSTED (ServingMemoryBudget). kilnd
  // passes --max_serving_memory_bytes.
  int64_t max_total_memory_bytes = int64_t{32} << 30;
  // Whether a caller sees a version loaded from `source` (its pinned form, "JOB@17"; empty for a
  // model with no version in memory): kilnd's rule is the source job's team (JobAccess). Unset:
  // every caller sees everything. FindFor and IndexFor ask it.
  std::function<bool(const server::Caller&, const std::string& source)> sees_source;
};

// What to load: `source` goes to the resolver. Versions are numbered per model (1, 2, 3, ...):
// a non-empty `version` (a positive integer) names the number, else the model's next one.
struct LoadRequest {
  std::string model;
  std::string source;
  std::string version;
  DeploymentOptions options;
  // When set, the model's version policy from now on (applied with this load).
  std::optional<VersionPolicy> policy;
  // When set, the model source the model follows from now on (empty: none): kilnd loads a new
  // version when it resolves to another checkpoint (e.g. "JOB@best" after a better epoch).
  std::optional<std::string> follow;
};

// One loaded checkpoint of a model. Immutable but for its batcher; shared by the repository and
// by requests in flight, so it lives until the last of them lets go.
class ServedVersion {
 public:
  const std::string& model() const { return model_; }
  const std::string& version() const { return version_; }
  const std::string& checkpoint_path() const { return checkpoint_path_; }
  // A model source that loads this same checkpoint again (the resolver's pinned form).
  const std::string& source() const { return source_; }
  const DeploymentOptions& options() const { return options_; }
  const Shape& input_shape() const { return input_shape_; }  // per sample, e.g. {1, 28, 28}
  int64_t input_elems() const { return input_elems_; }
  int64_t num_classes() const { return num_classes_; }
  // The memory its plan says it needs (its share of max_total_memory_bytes while in memory).
  int64_t memory_bytes() const { return reservation_.bytes(); }
  // An image or table model's batcher; a language model has none (language_model() instead).
  DynamicBatcher& batcher() const { return *batcher_; }
  // The served sequence model (a GPT: input_shape() is {T} token ids, num_classes() its vocab),
  // or null for other models. Its calls take turns on the model (LanguageModel).
  LanguageModel* language_model() const { return language_model_.get(); }

 private:
  friend class ModelRepository;
  ServedVersion() = default;

  std::string model_, version_, checkpoint_path_, source_;
  DeploymentOptions options_;
  Shape input_shape_;
  int64_t input_elems_ = 0, num_classes_ = 0;
  // Declared first: given back only after the backend and batcher have freed their memory.
  ServingMemoryBudget::Reservation reservation_;
  std::unique_ptr<Backend> backend_;               // declared before the batcher: outlives it
  std::unique_ptr<DynamicBatcher> batcher_;        // owns the session
  std::unique_ptr<LanguageModel> language_model_;  // instead of the batcher, for a GPT
};

// One row of the repository index.
struct ModelIndexEntry {
  std::string name, version;
  std::string state;   // "READY" or "UNAVAILABLE"
  std::string reason;  // why UNAVAILABLE
  std::string source;  // READY: the version's pinned source ("JOB@17"); else empty
};

// How many requests one loaded version's batcher holds waiting, for metrics.
struct VersionQueue {
  std::string model, version;
  int64_t queued_requests = 0;
};

// Thread-safe throughout.
class ModelRepository {
 public:
  explicit ModelRepository(ModelRepositoryOptions options = {});

  // Resolves and loads a checkpoint as a version of `request.model`, starting its batcher, then
  // makes it the model's default version and points the resolved aliases at it. A version with
  // the same label is replaced, whatever options (device, precision, ...) either was loaded with;
  // requests already holding the old one finish on it.
  // InvalidArgument for a bad name or option; the resolver's or loader's error otherwise.
  absl::StatusOr<std::shared_ptr<const ServedVersion>> Load(const LoadRequest& request);

  // Unloads one version (a label or alias) or, with `version` empty, the whole model. Requests
  // in flight finish; later ones get Unavailable. NotFound for an unknown model or version;
  // unloading an unloaded model again is OK, and so is unloading a version marked unavailable.
  absl::Status Unload(const std::string& model, const std::string& version = "");

  // The version to serve: `version` is a number, an alias, or empty for the default (the
  // highest number loaded, as Triton). NotFound for a model or version never loaded, Unavailable
  // for an unloaded model; both name it.
  absl::StatusOr<std::shared_ptr<const ServedVersion>> Find(const std::string& model,
                                                            const std::string& version) const;
  // Find for `caller`: a model whose newest version, or whose version asked for, the caller does
  // not see (options.sees_source) is answered as a model that does not exist.
  absl::StatusOr<std::shared_ptr<const ServedVersion>> FindFor(const server::Caller& caller,
                                                               const std::string& model,
                                                               const std::string& version) const;

  // Records that `version` of `model` could not be loaded (e.g. restoring it after a restart),
  // with the reason: the index shows it UNAVAILABLE with that reason, and requests for a model
  // with nothing loaded get Unavailable naming it, until the version loads or is unloaded.
  void MarkUnavailable(const std::string& model, const std::string& version,
                       const std::string& reason);

  // The model's policy and followed source (NotFound as for Find).
  absl::StatusOr<VersionPolicy> PolicyOf(const std::string& model) const;
  absl::StatusOr<std::string> FollowOf(const std::string& model) const;
  // Every model that follows a source, with that source.
  std::vector<std::pair<std::string, std::string>> Following() const;

  // A model's version numbers, lowest first (NotFound as for Find).
  absl::StatusOr<std::vector<std::string>> Versions(const std::string& model) const;

  // Every loaded version (READY), every version marked unavailable and every unloaded model
  // (UNAVAILABLE, with the reason), by name.
  std::vector<ModelIndexEntry> Index() const;
  // The entries `caller` sees (options.sees_source).
  std::vector<ModelIndexEntry> IndexFor(const server::Caller& caller) const;

  // Every loaded version's waiting requests (DynamicBatcher::queued_requests), by name; a
  // version that is unloaded, or replaced and still finishing its requests, is not listed.
  std::vector<VersionQueue> Queues() const;

  // What the versions in memory (loaded, loading, or unloaded and still finishing requests) hold
  // of max_total_memory_bytes.
  ServingMemoryUse MemoryInUse() const { return budget_->InUse(); }

  const ModelRepositoryOptions& options() const { return options_; }

  // The NotFound a model that does not exist answers (also one the caller does not see).
  static absl::Status UnknownModel(const std::string& model);

 private:
  struct Model {
    // By number; rbegin() is the default.
    std::map<int64_t, std::shared_ptr<const ServedVersion>> versions;
    std::map<std::string, int64_t> aliases;  // alias -> number
    VersionPolicy policy;
    std::string follow;  // the followed source; empty: none
  };

  // Drops a version from a model (caller holds mu_).
  static void RemoveVersion(Model& model, int64_t number);
  // The number of the loaded version `version` (a number or an alias) names, or 0 (caller holds
  // mu_).
  static int64_t FindVersionLocked(const Model& model, const std::string& version);
  // latest:max_versions_per_model, for a model whose loads never named a policy.
  VersionPolicy DefaultPolicy() const;
  static std::string VersionList(const Model& model);
  // The loaded model; Unavailable when it was unloaded, NotFound when never loaded (caller
  // holds mu_).
  absl::StatusOr<const Model*> FindModelLocked(const std::string& model) const;
  // The memory serving `checkpoint` with `options` needs (0 when the checkpoint cannot be read:
  // loading it reports that); RESOURCE_EXHAUSTED when that is more than max_memory_bytes.
  absl::StatusOr<int64_t> PlanMemory(const std::string& checkpoint,
                                     const DeploymentOptions& options, DeviceKind device,
                                     const BackendOptions& backend_options) const;
  absl::Status CheckOptions(const DeploymentOptions& options) const;
  // Load's steps after the request is checked and resolved. The number to load as (`number`, or
  // the model's next when 0), if the model's version policy and limit admit it.
  absl::StatusOr<int64_t> NumberToLoad(const LoadRequest& request, int64_t number);
  // Makes `version`'s backend, reserves its planned memory, then makes its session and batcher;
  // the error names the version.
  absl::Status StartVersion(ServedVersion& version) const;
  // StartVersion's last step for a sequence model: its LanguageModel instead of a batcher.
  absl::Status StartLanguageModel(ServedVersion& version) const;
  // Plans the memory `version` needs on its backend (over max_memory_bytes: RESOURCE_EXHAUSTED)
  // and reserves it in the budget (RESOURCE_EXHAUSTED when it does not fit beside the rest).
  absl::Status ReserveMemory(ServedVersion& version, const BackendOptions& backend_options) const;
  // Makes `version` the model's `number` under its (new) policy; versions replaced or dropped go
  // to *released, for the caller to let go after the lock. FailedPrecondition when the policy
  // drops `version` itself.
  absl::Status AddVersion(const LoadRequest& request, const std::vector<std::string>& aliases,
                          int64_t number, std::shared_ptr<const ServedVersion> version,
                          std::vector<std::shared_ptr<const ServedVersion>>* released);

  const ModelRepositoryOptions options_;
  // Shared with each version's reservation, which may outlive the repository.
  const std::shared_ptr<ServingMemoryBudget> budget_;
  mutable std::mutex mu_;
  std::map<std::string, Model> models_;
  std::set<std::string> unloaded_;  // unloaded and not loaded again since
  // model -> version -> why it could not be loaded (MarkUnavailable).
  std::map<std::string, std::map<std::string, std::string>> unavailable_;
  std::map<std::string, int64_t> next_number_;  // the next unnumbered version's number
};

}  // namespace kiln::serving
