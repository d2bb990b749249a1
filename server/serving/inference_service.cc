#include "server/serving/inference_service.h"

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/precision.h"
#include "server/grpc/call_auth.h"
#include "server/grpc/status_mapping.h"
#include "server/serving/tensor_codec.h"
#include "server/serving/token_codec.h"

#ifndef KILN_VERSION
#define KILN_VERSION "unknown"
#endif

namespace kiln::serving {
namespace {

absl::Status Prefixed(const ServedVersion& version, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat("model \"", version.model(), "\" version \"", version.version(),
                                   "\": ", std::string(status.message())));
}

absl::StatusOr<std::string> StringParameter(const std::string& key,
                                            const inference::ModelRepositoryParameter& p) {
  if (p.has_string_param()) return p.string_param();
  if (p.has_bytes_param()) return p.bytes_param();
  return absl::InvalidArgumentError(
      absl::StrCat("parameter \"", key, "\": must be a string_param"));
}

absl::StatusOr<int64_t> IntParameter(const std::string& key,
                                     const inference::ModelRepositoryParameter& p) {
  if (p.has_int64_param()) return p.int64_param();
  int64_t value;
  if (p.has_string_param() && absl::SimpleAtoi(p.string_param(), &value)) return value;
  return absl::InvalidArgumentError(
      absl::StrCat("parameter \"", key, "\": must be an int64_param (or a string holding one)"));
}

// "fp32", "tf32" or "bf16" (PrecisionNamed); any other word or type names the parameter.
absl::StatusOr<Precision> PrecisionParameter(const std::string& key,
                                             const inference::ModelRepositoryParameter& p) {
  KILN_ASSIGN_OR_RETURN(std::string word, StringParameter(key, p));
  if (std::optional<Precision> precision = PrecisionNamed(word)) return *precision;
  return absl::InvalidArgumentError(absl::StrCat("parameter \"", key, "\": \"", word,
                                                 "\" is not a precision; expected ",
                                                 std::string(kPrecisionNames)));
}

absl::StatusOr<LoadRequest> ParseLoad(const inference::RepositoryModelLoadRequest& request,
                                      const DeploymentOptions& defaults) {
  if (request.model_name().empty()) return absl::InvalidArgumentError("model_name: required");
  LoadRequest load;
  load.model = request.model_name();
  load.options = defaults;
  for (const auto& [key, value] : request.parameters()) {
    if (key == "checkpoint") {
      KILN_ASSIGN_OR_RETURN(load.source, StringParameter(key, value));
    } else if (key == "version") {
      KILN_ASSIGN_OR_RETURN(load.version, StringParameter(key, value));
    } else if (key == "device") {
      KILN_ASSIGN_OR_RETURN(load.options.device, StringParameter(key, value));
    } else if (key == "max_batch_size") {
      KILN_ASSIGN_OR_RETURN(int64_t n, IntParameter(key, value));
      if (n < 1 || n > (int64_t{1} << 30)) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter \"max_batch_size\": ", n, " is out of range"));
      }
      load.options.batching.max_batch_size = static_cast<int>(n);
    } else if (key == "threads") {
      KILN_ASSIGN_OR_RETURN(int64_t n, IntParameter(key, value));
      if (n < 0 || n > 1024) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter \"threads\": ", n, " is out of range 0..1024"));
      }
      load.options.threads = static_cast<int>(n);
    } else if (key == "precision") {
      KILN_ASSIGN_OR_RETURN(load.options.precision, PrecisionParameter(key, value));
    } else if (key == "version_policy") {
      KILN_ASSIGN_OR_RETURN(std::string text, StringParameter(key, value));
      KILN_ASSIGN_OR_RETURN(load.policy, VersionPolicy::Parse(text));
    } else if (key == "follow") {
      KILN_ASSIGN_OR_RETURN(std::string follow, StringParameter(key, value));
      load.follow = follow == "false" ? "" : follow;
    } else if (key == "max_queue_delay_us") {
      KILN_ASSIGN_OR_RETURN(load.options.batching.max_queue_delay_us, IntParameter(key, value));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter \"", key,
                       "\" is not supported; kilnd reads checkpoint, version, device, threads, "
                       "precision, max_batch_size, max_queue_delay_us, version_policy and "
                       "follow"));
    }
  }
  // "follow": "true" follows the checkpoint source as given (e.g. "JOB@best").
  if (load.follow && *load.follow == "true") {
    load.follow = load.source.empty() ? load.model : load.source;
  }
  return load;
}

}  // namespace

inference::RepositoryModelLoadRequest LoadRequestFor(const std::string& model,
                                                     const std::string& source,
                                                     const DeploymentOptions& options) {
  inference::RepositoryModelLoadRequest request;
  request.set_model_name(model);
  auto& params = *request.mutable_parameters();
  params["checkpoint"].set_string_param(source);
  params["device"].set_string_param(options.device);
  params["threads"].set_int64_param(options.threads);
  params["precision"].set_string_param(std::string(PrecisionName(options.precision)));
  params["max_batch_size"].set_int64_param(options.batching.max_batch_size);
  params["max_queue_delay_us"].set_int64_param(options.batching.max_queue_delay_us);
  return request;
}

InferenceService::InferenceService(ModelRepository* repository, InferenceServiceOptions options)
    : repository_(repository), options_(std::move(options)) {
  if (options_.server_version.empty()) options_.server_version = KILN_VERSION;
}

absl::Status InferenceService::Infer(const server::Caller& caller,
                                     const inference::ModelInferRequest& request,
                                     inference::ModelInferResponse* response,
                                     DynamicBatcher::RunInfo* info) const {
  if (request.model_name().empty()) return absl::InvalidArgumentError("model_name: required");
  KILN_ASSIGN_OR_RETURN(
      std::shared_ptr<const ServedVersion> version,
      repository_->FindFor(caller, request.model_name(), request.model_version()));
  if (version->language_model() != nullptr) return InferTokens(*version, request, response);
  absl::StatusOr<PixelInput> input = DecodeInput(request, version->input_elems());
  if (!input.ok()) return Prefixed(*version, input.status());
  if (input->samples > options_.max_request_samples) {
    return Prefixed(*version, absl::InvalidArgumentError(absl::StrCat(
                                  "input \"", kInputName, "\": batch ", input->samples,
                                  " is over the limit of ", options_.max_request_samples,
                                  " (--max_inference_batch)")));
  }
  absl::StatusOr<OutputSelection> outputs = SelectOutputs(request);
  if (!outputs.ok()) return Prefixed(*version, outputs.status());

  response->set_model_name(version->model());
  response->set_model_version(version->version());
  response->set_id(request.id());
  const ContentsForm form =
      request.raw_input_contents_size() > 0 ? ContentsForm::kRaw : ContentsForm::kTyped;
  const OutputBuffers buffers =
      PrepareOutputs(*outputs, input->samples, version->num_classes(), form, response);
  // `version` stays referenced until the batch ran, even when it is unloaded meanwhile.
  return version->batcher().Run(*input, buffers, info);
}

absl::Status InferenceService::InferTokens(const ServedVersion& version,
                                           const inference::ModelInferRequest& request,
                                           inference::ModelInferResponse* response) const {
  LanguageModel& lm = *version.language_model();
  absl::StatusOr<TokenInput> input =
      DecodeTokenInput(request, lm.shape().context, lm.shape().token_ids);
  if (!input.ok()) return Prefixed(version, input.status());
  if (input->batch > options_.max_request_samples) {
    return Prefixed(
        version, absl::InvalidArgumentError(absl::StrCat(
                     "input \"", kInputName, "\": batch ", input->batch, " is over the limit of ",
                     options_.max_request_samples, " (--max_inference_batch)")));
  }
  response->set_model_name(version.model());
  response->set_model_version(version.version());
  response->set_id(request.id());
  const int64_t vocab = lm.shape().vocab;
  std::vector<float> logits(static_cast<size_t>(input->batch * vocab));
  absl::Status ran = lm.LastLogits(input->ids, input->batch, input->length, logits.data());
  if (!ran.ok()) return Prefixed(version, ran);
  char* out = PrepareLogits(input->batch, vocab, request.raw_input_contents_size() > 0, response);
  std::memcpy(out, logits.data(), logits.size() * sizeof(float));
  return absl::OkStatus();
}

absl::Status InferenceService::Metadata(const server::Caller& caller,
                                        const inference::ModelMetadataRequest& request,
                                        inference::ModelMetadataResponse* response) const {
  if (request.name().empty()) return absl::InvalidArgumentError("name: required");
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<const ServedVersion> version,
                        repository_->FindFor(caller, request.name(), request.version()));
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> versions, repository_->Versions(request.name()));
  response->set_name(version->model());
  for (const std::string& v : versions) response->add_versions(v);
  response->set_platform("kiln");
  (*response->mutable_parameters())["precision"].set_string_param(
      std::string(PrecisionName(version->options().precision)));
  if (version->language_model() != nullptr) {
    // Token ids [batch, length <= T]; INT32 is accepted too.
    auto* input = response->add_inputs();
    input->set_name(kInputName);
    input->set_datatype("INT64");
    input->add_shape(-1);
    input->add_shape(-1);
    auto* logits = response->add_outputs();
    logits->set_name(kLogitsOutput);
    logits->set_datatype("FP32");
    logits->add_shape(-1);
    logits->add_shape(version->num_classes());
    return absl::OkStatus();
  }
  // FP32 is the input's declared datatype; UINT8 (raw pixels) is accepted too.
  auto* input = response->add_inputs();
  input->set_name(kInputName);
  input->set_datatype("FP32");
  input->add_shape(-1);
  for (int64_t d : version->input_shape()) input->add_shape(d);
  auto* probs = response->add_outputs();
  probs->set_name(kProbabilitiesOutput);
  probs->set_datatype("FP32");
  probs->add_shape(-1);
  probs->add_shape(version->num_classes());
  auto* cls = response->add_outputs();
  cls->set_name(kClassOutput);
  cls->set_datatype("INT64");
  cls->add_shape(-1);
  return absl::OkStatus();
}

absl::Status InferenceService::LoadModel(const inference::RepositoryModelLoadRequest& request) {
  KILN_ASSIGN_OR_RETURN(LoadRequest load, ParseLoad(request, options_.default_deployment));
  std::lock_guard<std::mutex> lock(change_mu_);
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<const ServedVersion> loaded, repository_->Load(load));
  if (!options_.record_deployments) return absl::OkStatus();
  absl::Status recorded = options_.record_deployments(load.model, RecordsOf(load.model));
  if (recorded.ok()) return absl::OkStatus();
  // Served but not durable would vanish at the next restart: undo it and say why.
  repository_->Unload(load.model, loaded->version()).IgnoreError();
  return absl::Status(
      recorded.code(),
      absl::StrCat("model \"", load.model, "\" version \"", loaded->version(),
                   "\": loaded but not recorded, so unloaded again: ", recorded.message()));
}

std::vector<DeploymentRecord> InferenceService::RecordsOf(const std::string& model) const {
  std::vector<DeploymentRecord> records;
  absl::StatusOr<std::vector<std::string>> labels = repository_->Versions(model);
  absl::StatusOr<VersionPolicy> policy = repository_->PolicyOf(model);
  absl::StatusOr<std::string> follow = repository_->FollowOf(model);
  if (!labels.ok() || !policy.ok() || !follow.ok()) return records;  // nothing loaded
  for (const std::string& label : *labels) {
    absl::StatusOr<std::shared_ptr<const ServedVersion>> v = repository_->Find(model, label);
    if (!v.ok()) continue;  // unloaded meanwhile by a request outside this service
    DeploymentRecord record{model, label, LoadRequestFor(model, (*v)->source(), (*v)->options())};
    auto& params = *record.request.mutable_parameters();
    params["version"].set_string_param(label);
    params["version_policy"].set_string_param(policy->ToString());
    params["follow"].set_string_param(follow->empty() ? "false" : *follow);
    records.push_back(std::move(record));
  }
  return records;
}

std::vector<std::string> InferenceService::Restore(const std::vector<DeploymentRecord>& records) {
  std::vector<std::string> failures;
  std::lock_guard<std::mutex> lock(change_mu_);
  for (const DeploymentRecord& record : records) {
    std::string reason;
    if (record.restore_interrupted) {
      // Loading it again would likely kill kilnd again, at every start: a crash loop.
      reason = kInterruptedRestoreReason;
    } else {
      if (options_.note_restore) options_.note_restore(record, RestorePhase::kLoading);
      absl::Status status = [&]() -> absl::Status {
        KILN_ASSIGN_OR_RETURN(LoadRequest load,
                              ParseLoad(record.request, options_.default_deployment));
        return repository_->Load(load).status();
      }();
      if (options_.note_restore) options_.note_restore(record, RestorePhase::kSettled);
      if (status.ok()) continue;
      reason = absl::StrCat(absl::StatusCodeToString(status.code()), ": ", status.message());
    }
    repository_->MarkUnavailable(record.model, record.version, reason);
    failures.push_back(absl::StrCat(record.model, " ", record.version, ": ", reason));
  }
  return failures;
}

absl::Status InferenceService::UnloadModel(const inference::RepositoryModelUnloadRequest& request) {
  if (request.model_name().empty()) return absl::InvalidArgumentError("model_name: required");
  std::string version;
  for (const auto& [key, value] : request.parameters()) {
    if (key == "version") {
      KILN_ASSIGN_OR_RETURN(version, StringParameter(key, value));
    } else if (key != "unload_dependents") {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter \"", key, "\" is not supported; kilnd reads version and unload_dependents"));
    }
  }
  std::lock_guard<std::mutex> lock(change_mu_);
  KILN_RETURN_IF_ERROR(repository_->Unload(request.model_name(), version));
  if (!options_.record_deployments) return absl::OkStatus();
  absl::Status recorded =
      options_.record_deployments(request.model_name(), RecordsOf(request.model_name()));
  if (recorded.ok()) return absl::OkStatus();
  return absl::Status(recorded.code(),
                      absl::StrCat("model \"", request.model_name(),
                                   "\": unloaded, but the record could not be updated, so it "
                                   "will be loaded again when kilnd restarts: ",
                                   recorded.message()));
}

absl::StatusOr<bool> InferenceService::ModelIsReady(const server::Caller& caller,
                                                    const std::string& model,
                                                    const std::string& version) const {
  if (model.empty()) return absl::InvalidArgumentError("name: required");
  return repository_->FindFor(caller, model, version).ok();
}

void InferenceService::ServerInfo(inference::ServerMetadataResponse* response) const {
  response->set_name(options_.server_name);
  response->set_version(options_.server_version);
  response->add_extensions("model_repository");
}

void InferenceService::Index(const server::Caller& caller,
                             const inference::RepositoryIndexRequest& request,
                             inference::RepositoryIndexResponse* response) const {
  for (const ModelIndexEntry& entry : repository_->IndexFor(caller)) {
    if (request.ready() && entry.state != "READY") continue;
    auto* model = response->add_models();
    model->set_name(entry.name);
    model->set_version(entry.version);
    model->set_state(entry.state);
    model->set_reason(entry.reason);
  }
}

absl::Status InferenceService::InferCounted(const server::Caller& caller,
                                            const inference::ModelInferRequest& request,
                                            inference::ModelInferResponse* response) const {
  const auto start = std::chrono::steady_clock::now();
  DynamicBatcher::RunInfo info;
  absl::Status status = Infer(caller, request, response, &info);
  if (options_.on_infer) {
    // Labels name only what is loaded: a client's random model and version names would each
    // make series of their own.
    std::string model = "unknown", version = "unknown";
    if (status.ok()) {
      model = request.model_name();
      version = response->model_version();
    } else if (auto served = repository_->Find(request.model_name(), request.model_version());
               served.ok()) {
      model = request.model_name();
      version = (*served)->version();
    }
    options_.on_infer(
        model, version, status.code(),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
        info.queue_seconds, info.batch_size);
  }
  return status;
}

absl::Status InferenceService::CheckModelName(const server::Caller& caller,
                                              const std::string& model, bool loading) const {
  if (!repository_->Find(model, "").ok()) return absl::OkStatus();  // nothing served under it
  absl::StatusOr<std::shared_ptr<const ServedVersion>> seen =
      repository_->FindFor(caller, model, "");
  if (!seen.ok()) {
    if (!loading) return seen.status();  // another team's: not there for this caller
    return absl::AlreadyExistsError(absl::StrCat(
        "model_name: \"", model, "\" is served for another team; deploy under another name"));
  }
  return options_.check_source ? options_.check_source(caller, (*seen)->source())
                               : absl::OkStatus();
}

absl::Status InferenceService::LoadAnnounced(const server::Caller& caller,
                                             const inference::RepositoryModelLoadRequest& request) {
  auto it = request.parameters().find("checkpoint");
  const std::string source =
      it != request.parameters().end() ? it->second.string_param() : request.model_name();
  absl::Status status = server::Authorize(caller, server::Action::kDeploy);
  if (status.ok()) status = CheckModelName(caller, request.model_name(), /*loading=*/true);
  if (status.ok() && options_.check_source) status = options_.check_source(caller, source);
  if (status.ok()) status = LoadModel(request);
  if (status.ok() && options_.on_repository_change) {
    options_.on_repository_change(request.model_name(), source, true);
  }
  if (options_.audit) {
    options_.audit(caller, server::Action::kDeploy,
                   absl::StrCat("model ", request.model_name(), " from ", source), status);
  }
  return status;
}

absl::Status InferenceService::UnloadAnnounced(
    const server::Caller& caller, const inference::RepositoryModelUnloadRequest& request) {
  absl::Status status = server::Authorize(caller, server::Action::kUndeploy);
  if (status.ok()) status = CheckModelName(caller, request.model_name(), /*loading=*/false);
  if (status.ok()) status = UnloadModel(request);
  if (status.ok() && options_.on_repository_change) {
    options_.on_repository_change(request.model_name(), "", false);
  }
  if (options_.audit) {
    options_.audit(caller, server::Action::kUndeploy, absl::StrCat("model ", request.model_name()),
                   status);
  }
  return status;
}

grpc::Status InferenceService::ServerLive(grpc::ServerContext* context,
                                          const inference::ServerLiveRequest*,
                                          inference::ServerLiveResponse* response) {
  if (absl::Status s = server::CallAuthStatus(*context); !s.ok()) return server::ToGrpcStatus(s);
  response->set_live(true);
  return grpc::Status::OK;
}

grpc::Status InferenceService::ServerReady(grpc::ServerContext* context,
                                           const inference::ServerReadyRequest*,
                                           inference::ServerReadyResponse* response) {
  if (absl::Status s = server::CallAuthStatus(*context); !s.ok()) return server::ToGrpcStatus(s);
  response->set_ready(Ready());
  return grpc::Status::OK;
}

grpc::Status InferenceService::ModelReady(grpc::ServerContext* context,
                                          const inference::ModelReadyRequest* request,
                                          inference::ModelReadyResponse* response) {
  absl::StatusOr<server::Caller> caller = server::CallerOf(*context);
  if (!caller.ok()) return server::ToGrpcStatus(caller.status());
  absl::StatusOr<bool> ready = ModelIsReady(*caller, request->name(), request->version());
  if (!ready.ok()) return server::ToGrpcStatus(ready.status());
  response->set_ready(*ready);
  return grpc::Status::OK;
}

grpc::Status InferenceService::ServerMetadata(grpc::ServerContext* context,
                                              const inference::ServerMetadataRequest*,
                                              inference::ServerMetadataResponse* response) {
  if (absl::Status s = server::CallAuthStatus(*context); !s.ok()) return server::ToGrpcStatus(s);
  ServerInfo(response);
  return grpc::Status::OK;
}

grpc::Status InferenceService::ModelMetadata(grpc::ServerContext* context,
                                             const inference::ModelMetadataRequest* request,
                                             inference::ModelMetadataResponse* response) {
  absl::StatusOr<server::Caller> caller = server::CallerOf(*context);
  if (!caller.ok()) return server::ToGrpcStatus(caller.status());
  absl::Status status = Metadata(*caller, *request, response);
  if (!status.ok()) response->Clear();
  return server::ToGrpcStatus(status);
}

grpc::Status InferenceService::ModelInfer(grpc::ServerContext* context,
                                          const inference::ModelInferRequest* request,
                                          inference::ModelInferResponse* response) {
  absl::StatusOr<server::Caller> caller = server::CallerOf(*context);
  if (!caller.ok()) return server::ToGrpcStatus(caller.status());
  absl::Status status = InferCounted(*caller, *request, response);
  if (!status.ok()) response->Clear();
  return server::ToGrpcStatus(status);
}

grpc::Status InferenceService::RepositoryIndex(grpc::ServerContext* context,
                                               const inference::RepositoryIndexRequest* request,
                                               inference::RepositoryIndexResponse* response) {
  absl::StatusOr<server::Caller> caller = server::CallerOf(*context);
  if (!caller.ok()) return server::ToGrpcStatus(caller.status());
  Index(*caller, *request, response);
  return grpc::Status::OK;
}

grpc::Status InferenceService::RepositoryModelLoad(
    grpc::ServerContext* context, const inference::RepositoryModelLoadRequest* request,
    inference::RepositoryModelLoadResponse*) {
  absl::StatusOr<server::Caller> caller = server::CallerOf(*context);
  if (!caller.ok()) return server::ToGrpcStatus(caller.status());
  return server::ToGrpcStatus(LoadAnnounced(*caller, *request));
}

grpc::Status InferenceService::RepositoryModelUnload(
    grpc::ServerContext* context, const inference::RepositoryModelUnloadRequest* request,
    inference::RepositoryModelUnloadResponse*) {
  absl::StatusOr<server::Caller> caller = server::CallerOf(*context);
  if (!caller.ok()) return server::ToGrpcStatus(caller.status());
  return server::ToGrpcStatus(UnloadAnnounced(*caller, *request));
}

}  // namespace kiln::serving
